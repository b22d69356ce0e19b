"""Shared pytest settings: deterministic torch, few threads on small CI machines."""

import torch

torch.set_num_threads(min(2, torch.get_num_threads()))
