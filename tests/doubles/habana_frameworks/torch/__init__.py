"""Double of ``habana_frameworks.torch``; unlike the real bridge it patches nothing."""


def _register_compile_backend() -> None:
    # The real bridge registers its torch.compile backend, "hpu_backend", on import; the
    # double registers one that runs the captured graph as it is.
    import torch._dynamo

    if "hpu_backend" in torch._dynamo.list_backends(exclude_tags=()):
        return

    def hpu_backend(graph_module: object, example_inputs: object) -> object:
        return graph_module.forward  # type: ignore[attr-defined]

    torch._dynamo.register_backend(name="hpu_backend")(hpu_backend)


_register_compile_backend()
