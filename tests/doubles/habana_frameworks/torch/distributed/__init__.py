"""Double of ``habana_frameworks.torch.distributed``."""
