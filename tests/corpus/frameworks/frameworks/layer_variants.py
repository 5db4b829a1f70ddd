"""References of the frameworks corpus for layer variants the session of 2026-11-26 added: an
MLP with LoRA adapters, one with int8 weights and per-channel scales, the LM head's loss with
label smoothing, and Mamba's mixer without its scan (the in-projection, a causal depthwise
conv1d, the gate); and (twelfth session) the LM head's z-loss and Mixtral-style experts held as
stacked weights. Sizes and inputs as in models.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .models import EXPERTS, FFN, HIDDEN, MLP, SEQ, LMHead

LORA_RANK = 4
LABEL_SMOOTHING = 0.1
Z_LOSS = 1e-4


class LoRAMLP(MLP):
    """The MLP with a LoRA adapter on each linear (A then B, added to the base output)."""

    def __init__(self) -> None:
        super().__init__()
        self.up_lora_a = nn.Linear(HIDDEN, LORA_RANK, bias=False)
        self.up_lora_b = nn.Linear(LORA_RANK, FFN, bias=False)
        self.down_lora_a = nn.Linear(FFN, LORA_RANK, bias=False)
        self.down_lora_b = nn.Linear(LORA_RANK, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x) + self.up_lora_b(self.up_lora_a(x)))
        return self.down(h) + self.down_lora_b(self.down_lora_a(h))


class Int8MLP(nn.Module):
    """Weights stored as int8 with one float scale per output channel, dequantized in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("up_q", torch.randint(-127, 128, (FFN, HIDDEN), dtype=torch.int8))
        self.up_scale = nn.Parameter(torch.rand(FFN) / 64)
        self.register_buffer("down_q", torch.randint(-127, 128, (HIDDEN, FFN), dtype=torch.int8))
        self.down_scale = nn.Parameter(torch.rand(HIDDEN) / 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_q.to(x.dtype) * self.up_scale[:, None]
        down = self.down_q.to(x.dtype) * self.down_scale[:, None]
        return F.linear(F.gelu(F.linear(x, up)), down)


class SmoothedLMHeadLoss(LMHead):
    """The LM head's mean cross entropy with label smoothing."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), label_smoothing=LABEL_SMOOTHING)


class LMHeadZLoss(LMHead):
    """PaLM's z-loss of the LM head: the squared logsumexp of each token's logits, scaled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Z_LOSS * torch.logsumexp(self.lm_head(x), dim=-1).pow(2)


class StackedExperts(nn.Module):
    """Mixtral-style experts as stacked gate / up / down weights ([experts, out, in]), every expert
    run on every token and weighted by the token's top-2 routing weight for it (zero elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.w_gate = nn.Parameter(torch.randn(EXPERTS, FFN, HIDDEN) / HIDDEN**0.5)
        self.w_up = nn.Parameter(torch.randn(EXPERTS, FFN, HIDDEN) / HIDDEN**0.5)
        self.w_down = nn.Parameter(torch.randn(EXPERTS, HIDDEN, FFN) / FFN**0.5)

    def routing(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        weights, chosen = logits.softmax(-1).topk(2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return torch.zeros_like(logits).scatter(-1, chosen, weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(torch.einsum("bsh,efh->bsef", x, self.w_gate)) * torch.einsum("bsh,efh->bsef", x, self.w_up)
        out = torch.einsum("bsef,ehf->bseh", hidden, self.w_down)
        return (self.routing(x).unsqueeze(-1) * out).sum(-2)


def lm_head_z_loss() -> LMHeadZLoss:
    return LMHeadZLoss()


def stacked_experts() -> StackedExperts:
    return StackedExperts()


def lora_mlp() -> LoRAMLP:
    return LoRAMLP()


def int8_mlp() -> Int8MLP:
    return Int8MLP()


def smoothed_lm_head_loss() -> SmoothedLMHeadLoss:
    return SmoothedLMHeadLoss()


def batch_of_four() -> tuple[torch.Tensor]:
    return (torch.randn(4, SEQ, HIDDEN),)


class ShortConvMixer(nn.Module):
    """Mamba's mixer without the scan: the input projected to [x; z], a causal depthwise conv1d over
    the sequence on x (kernel 4, padded 3 and cut back to the sequence), the gate silu(z), the
    output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.conv1d = nn.Conv1d(FFN, FFN, kernel_size=4, groups=FFN, padding=3)
        self.out_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(hidden).chunk(2, dim=-1)
        x = self.conv1d(x.transpose(1, 2))[..., : hidden.shape[1]].transpose(1, 2)
        return self.out_proj(F.silu(x) * F.silu(z))


def short_conv_mixer() -> ShortConvMixer:
    return ShortConvMixer()
