"""The run stage: the training loop, optimizers, checkpoints, data-parallel workers, reporters and the train CLI."""
