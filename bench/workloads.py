"""The benchmark's models: one :class:`Model` spec per workload.

A spec says how to build the module, how to build its inputs for a (batch,
sequence length) pair, how to compute its scalar loss, the shape its
steady-state backward is timed at, and which shapes the dynamic-shape sequence
walks through. Every model is built from a small config with random weights:
nothing is downloaded (Hugging Face models are built offline from configs).
"""

import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test"))

import models as test_models  # noqa: E402  (test/models.py: mlp, convnet)
from resnet import resnet18  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

Inputs = tuple[Any, ...]

HF_VOCAB = 1000


@dataclass(frozen=True)
class Model:
    """One benchmark workload."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[int, int], Inputs]  # (batch, seq) -> positional inputs
    loss: Callable[[nn.Module, Inputs], Tensor]
    batch: int = 8  # steady-state shape
    seq: int = 0  # 0: not a sequence model
    reps: int = 20  # steady-state repetitions (>= 20)
    dynamic_batches: Sequence[int] = (4, 5, 6, 7, 8)
    dynamic_seqs: Sequence[int] = ()  # sequence lengths, at batch ``batch``


# ---------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------


def squared_mean_loss(model: nn.Module, inputs: Inputs) -> Tensor:
    """mean(output**2): the loss test/ and the demo use for plain modules."""
    return model(*inputs).pow(2).mean()


def sum_loss(model: nn.Module, inputs: Inputs) -> Tensor:
    return model(*inputs).sum()


def cross_entropy_loss(model: nn.Module, inputs: Inputs) -> Tensor:
    images, labels = inputs
    return F.cross_entropy(model(images), labels)


def hf_loss(model: nn.Module, inputs: Inputs) -> Tensor:
    """Hugging Face models compute their own loss from ``labels``."""
    input_ids, labels = inputs
    return model(input_ids=input_ids, labels=labels).loss


# ---------------------------------------------------------------------------
# Models and inputs
# ---------------------------------------------------------------------------


class ElementwiseChain(nn.Module):
    """20 pointwise ops on one parameter of shape (size,). Its backward is
    tiny, so compiled backward time is mostly the engines' per-call overhead
    (cache lookup, lifting inputs, guards)."""

    def __init__(self, size: int = 64) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.randn(size))

    def forward(self) -> Tensor:
        x = self.x
        y = (x * 1.1).sin()
        y = (y + 0.5).exp()
        y = (y * x).tanh()
        y = (y - 0.25).cos()
        y = (y * y).sigmoid()
        y = (y + x).relu()
        y = ((y * 0.9) + 1.0).log()
        y = y.neg().exp()
        y = (y * x).sin()
        return y.pow(2)  # 20 ops


def no_inputs(batch: int, seq: int) -> Inputs:
    return ()


def mlp_inputs(batch: int, seq: int) -> Inputs:
    return (test_models.mlp_input(batch),)


def convnet_inputs(batch: int, seq: int) -> Inputs:
    return (test_models.convnet_input(batch),)


RESNET_IMAGE = 64  # 64x64 images keep resnet18 affordable on 2 CPU cores


def resnet_inputs(batch: int, seq: int) -> Inputs:
    return torch.randn(batch, 3, RESNET_IMAGE, RESNET_IMAGE), torch.randint(0, 10, (batch,))


def transformer_encoder(layers: int, d_model: int, nhead: int = 4) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def encoder_inputs(d_model: int) -> Callable[[int, int], Inputs]:
    def make(batch: int, seq: int) -> Inputs:
        return (torch.randn(batch, seq, d_model),)

    return make


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=HF_VOCAB, n_positions=128,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    return GPT2LMHeadModel(config).train()


def gpt2_inputs(batch: int, seq: int) -> Inputs:
    input_ids = torch.randint(0, HF_VOCAB, (batch, seq))
    return input_ids, input_ids  # the model shifts labels itself


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=HF_VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=128,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config).train()


def bert_inputs(batch: int, seq: int) -> Inputs:
    """Random tokens; 15% of positions are masked-LM targets, the rest -100."""
    input_ids = torch.randint(0, HF_VOCAB, (batch, seq))
    targets = torch.rand(batch, seq) < 0.15
    targets[:, 0] = True  # at least one target per row
    return input_ids, torch.where(targets, input_ids, torch.full_like(input_ids, -100))


SEQ_LENGTHS = (32, 48, 64)

MODELS: dict[str, Model] = {
    spec.name: spec
    for spec in (
        Model("elementwise20", "20 pointwise ops on a (64,) parameter (cache-hit overhead)",
              ElementwiseChain, no_inputs, sum_loss, batch=0, reps=200, dynamic_batches=()),
        Model("mlp", "test/models.py mlp: 3 Linear, 16->32->32->4", test_models.mlp, mlp_inputs,
              squared_mean_loss, reps=100),
        Model("convnet", "test/models.py convnet: 2 conv + BN, 16x16 images", test_models.convnet,
              convnet_inputs, squared_mean_loss, reps=50),
        Model("resnet18", f"ResNet-18 (bench/resnet.py), {RESNET_IMAGE}x{RESNET_IMAGE} images, cross-entropy",
              resnet18, resnet_inputs, cross_entropy_loss, reps=20),
        Model("transformer_encoder", "nn.TransformerEncoder, 4 layers, d_model 256, 4 heads",
              lambda: transformer_encoder(4, 256), encoder_inputs(256), squared_mean_loss,
              seq=64, reps=20, dynamic_seqs=SEQ_LENGTHS),
        Model("transformer_encoder_small", "nn.TransformerEncoder, 1 layer, d_model 64, 4 heads (quick mode)",
              lambda: transformer_encoder(1, 64), encoder_inputs(64), squared_mean_loss,
              seq=64, reps=30, dynamic_seqs=SEQ_LENGTHS),
        Model("gpt2", "HF GPT2LMHeadModel, 4 layers, n_embd 256, 4 heads, vocab 1000",
              gpt2, gpt2_inputs, hf_loss, seq=64, reps=20, dynamic_seqs=SEQ_LENGTHS),
        Model("bert", "HF BertForMaskedLM, 4 layers, hidden 256, 4 heads, vocab 1000",
              bert, bert_inputs, hf_loss, seq=64, reps=20, dynamic_seqs=SEQ_LENGTHS),
    )
}

FULL = ("elementwise20", "mlp", "convnet", "resnet18", "transformer_encoder", "gpt2", "bert")
QUICK = ("elementwise20", "mlp", "transformer_encoder_small")


def count_autograd_nodes(loss: Tensor) -> int:
    """Distinct autograd nodes reachable from ``loss.grad_fn`` (AccumulateGrad included)."""
    seen: dict[int, Any] = {}  # keeps the Python wrappers alive, so ids stay unique
    stack: list[Optional[Any]] = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)
