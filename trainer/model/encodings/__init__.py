"""Position encodings as `nn.Module`s registered in the model; the registry is `trainer.model.position`."""
