"""Double of ``habana_frameworks.torch``; unlike the real bridge it patches nothing."""
