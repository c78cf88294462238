"""Arithmetic of GPT-style models: parameters, FLOPs per iteration, memory per GPU.

Formulas follow Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (SC'21): parameters from their eq. (2) and FLOPs per iteration from eq. (3),
which counts the extra forward pass of full activation recomputation. Achieved FLOP/s in this
project is always counted with eq. (3), so our figures compare directly with that paper's.
"""

from __future__ import annotations

from unicron.core.specs import ModelSpec

BYTES_FP16 = 2
# Mixed-precision Adam: fp16 weights and grads (2+2), fp32 master weights, momentum, variance.
MODEL_STATE_BYTES_PER_PARAM = 16


def parameter_count(m: ModelSpec) -> float:
    """Parameters of a GPT model (embeddings included)."""
    h, layers = m.hidden_size, m.layers
    return 12 * layers * h * h * (1 + 13 / (12 * h) + (m.vocabulary + m.sequence_length) / (12 * layers * h))


def flops_per_iteration(m: ModelSpec) -> float:
    """FLOPs of one optimizer step over the global batch, with activation recomputation."""
    h, layers, s = m.hidden_size, m.layers, m.sequence_length
    return 96 * m.global_batch * s * layers * h * h * (1 + s / (6 * h) + m.vocabulary / (16 * layers * h))


def flops_per_sample(m: ModelSpec) -> float:
    return flops_per_iteration(m) / m.global_batch


def model_state_bytes(m: ModelSpec) -> float:
    """Bytes of weights, gradients and optimizer state for the whole model."""
    return MODEL_STATE_BYTES_PER_PARAM * parameter_count(m)
