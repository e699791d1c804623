"""Small models shared by the tests, the demo and the benchmarks."""

import torch
from torch import nn


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def mlp_input(batch: int) -> torch.Tensor:
    return torch.randn(batch, 16)


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def convnet_input(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16)


def transformer_encoder(layers: int = 2, d_model: int = 32) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def transformer_input(batch: int, seq: int = 10, d_model: int = 32) -> torch.Tensor:
    return torch.randn(batch, seq, d_model)


MODELS = {
    "mlp": (mlp, mlp_input),
    "convnet": (convnet, convnet_input),
    "transformer_encoder": (transformer_encoder, transformer_input),
}
