"""Double of ``habana_frameworks.torch.utils``."""
