"""How ``try_families.py`` builds a family: a model, its inputs and its loss.

Every family is a tiny random configuration of a library's model, built the way its
users build it (the library's own config and model classes), trained through the loss
that library's users take: the model's own (``labels``) for transformers, a regression
of the output for diffusers' models, which take none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

BATCH, TOKENS, VOCAB, IMAGE, CLASSES = 2, 16, 100, 32, 3


@dataclass(frozen=True)
class Tried:
    """A family built: its model, the keyword inputs of a step and the step's loss."""

    model: nn.Module
    inputs: dict[str, Any]
    loss_of: Callable[[Any], torch.Tensor]
    #: The library the family comes from (named where it is not installed).
    package: str = "transformers"

    def loss(self, model: nn.Module) -> torch.Tensor:
        """One forward of ``model`` on the inputs, and its loss."""
        return self.loss_of(model(**self.inputs))


Builder = Callable[[], Tried]


def _own_loss(out: Any) -> torch.Tensor:
    return out.loss  # type: ignore[no-any-return]


def sample_loss(out: Any) -> torch.Tensor:
    """A diffusers model's loss: the mean square of its output (``out.sample``)."""
    return out.sample.pow(2).mean()  # type: ignore[no-any-return]


def generated(seed: int, *shape: int) -> torch.Tensor:
    """Inputs drawn from their own generator, the same in every process."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def token_ids() -> torch.Tensor:
    """A batch of token ids, the same in every process."""
    return torch.randint(3, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))


def _transformers(
    config: str, model: str, inputs: Callable[[], dict[str, Any]], **settings: Any
) -> Builder:
    """A transformers model from its config class, trained on its own loss (``labels``)."""

    def build() -> Tried:
        import transformers

        built = getattr(transformers, model)(getattr(transformers, config)(**settings))
        return Tried(built, inputs(), _own_loss)

    return build


def text_family(config: str, model: str, seq2seq: bool = False, **sizes: Any) -> Builder:
    """A transformers text model trained on its own language-modelling loss."""

    def inputs() -> dict[str, Any]:
        ids = token_ids()
        return {"input_ids": ids, "labels": ids.flip(1) if seq2seq else ids}

    return _transformers(config, model, inputs, vocab_size=VOCAB, **sizes)


def image_family(config: str, model: str, **sizes: Any) -> Builder:
    """A transformers image classifier trained on its own loss (``labels``)."""

    def inputs() -> dict[str, Any]:
        pixels = generated(1, BATCH, 3, IMAGE, IMAGE)
        return {"pixel_values": pixels, "labels": torch.arange(BATCH) % CLASSES}

    return _transformers(config, model, inputs, num_labels=CLASSES, **sizes)
