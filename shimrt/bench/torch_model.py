"""A decoder-only transformer built from torch.nn (bf16 compute), for benchmarking a real
training step.

No weights are downloaded: the model is initialised from a seed, and its batch is random tokens
from the same seed, so every run (and every policy in one run) starts from the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import validate
from ..errors import UsageError

__all__ = ["ModelSize", "build", "batch"]

#: The parameters' dtype: bf16 throughout, or fp32 master weights with bf16 autocast (mixed
#: precision, the usual data-parallel set-up: its gradients, and so its all-reduces, are fp32).
WEIGHTS = ("bfloat16", "float32")


@dataclass(frozen=True)
class ModelSize:
    """A decoder's shape and its batch: ``layers`` blocks of ``width`` channels and ``heads``
    attention heads, a ``vocab``-token vocabulary, ``batch`` sequences of ``seq`` tokens; its
    ``weights`` one of :data:`WEIGHTS` (the compute is bf16 either way)."""

    width: int = 2048
    heads: int = 16
    layers: int = 8
    vocab: int = 32768
    seq: int = 1024
    batch: int = 8
    weights: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("width", "heads", "layers", "vocab", "seq", "batch"):
            # torch takes sizes as int64, but a dimension beyond a C int is a typo, never a model.
            object.__setattr__(self, name, validate.integer(getattr(self, name), f"ModelSize.{name}", least=1,
                                                            most=validate.MAX_INT32))
        validate.one_of(self.weights, "ModelSize.weights", WEIGHTS)
        if self.width % self.heads or (self.width // self.heads) % 8:
            raise UsageError(f"ModelSize.width must be a multiple of heads ({self.heads}) with a head size that is "
                             f"a multiple of 8, not {self.width}")

    @property
    def parameters(self) -> int:
        """Parameters in all: embeddings and head, and per block attention (4 w^2), the MLP
        (8 w^2) and two LayerNorms."""
        w = self.width
        return 2 * self.vocab * w + self.seq * w + self.layers * (12 * w * w + 4 * w) + 2 * w

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def record(self) -> dict:
        """The shape with its parameters and tokens, as the benchmarks' JSON gives it."""
        return vars(self) | {"parameters": self.parameters, "tokens": self.tokens}


def build(size: ModelSize, device: Any, seed: int = 0) -> Any:
    """The decoder, in bfloat16 on ``device`` (a torch device), initialised from ``seed``."""
    import torch
    from torch import nn
    from torch.nn import functional

    if not isinstance(size, ModelSize):
        raise UsageError(f"size must be a ModelSize, not {size!r:.100}")

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(size.width, 3 * size.width, bias=False)
            self.out = nn.Linear(size.width, size.width, bias=False)

        def forward(self, x):
            b, s, w = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, size.heads, w // size.heads).permute(2, 0, 3, 1, 4)
            y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, s, w))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(size.width), nn.LayerNorm(size.width)
            self.attention = Attention()
            self.mlp = nn.Sequential(nn.Linear(size.width, 4 * size.width, bias=False), nn.GELU(),
                                     nn.Linear(4 * size.width, size.width, bias=False))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(size.vocab, size.width)
            self.position = nn.Embedding(size.seq, size.width)
            self.blocks = nn.ModuleList(Block() for _ in range(size.layers))
            self.ln = nn.LayerNorm(size.width)
            self.head = nn.Linear(size.width, size.vocab, bias=False)

        def forward(self, tokens, targets):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=size.weights == "float32"):
                x = self.embed(tokens) + self.position.weight[: tokens.shape[1]]
                for block in self.blocks:
                    x = block(x)
                logits = self.head(self.ln(x))
            return functional.cross_entropy(logits.float().view(-1, size.vocab), targets.view(-1))

    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: a billion parameters take seconds on the host
        model = Decoder()
    return model.to(dtype=getattr(torch, size.weights))


def batch(size: ModelSize, device: Any, seed: int = 0) -> tuple[Any, Any]:
    """(tokens, targets): ``size.batch`` random sequences and the same shifted by one token."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq + 1), generator=g)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
