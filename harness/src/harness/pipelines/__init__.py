"""The pipelines that chain the packages (``train-then-serve``): each package is used only through its public API,
and they meet through the Hugging Face checkpoint directory and torch.distributed."""
