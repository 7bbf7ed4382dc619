"""Layer ops of a kernel or host op and the bytes it must move (its floor at a read bandwidth).

A GEMM whose shapes are known (the host op that launched it was recorded with shapes:
``aten::linear``, ``aten::mm``, ``aten::addmm``) moves its weight, input and output once:
``elem * (N*K + M*K + M*N)``; its weight shape (N, K) names the layer (``qkv_proj``, ``down_proj``,
``lm_head`` ...) from the model's linear weights. A norm with shapes reads and writes its input
and reads its weight. Attention reads the KV cache of the step's context (estimated from the
load: ``context_tokens`` keys and values per layer). Kernels of CUDA graph replays carry no
shapes; their class is found by name, and the class totals use the model's weight bytes.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

GEMM, ATTENTION, NORM, OTHER = "gemm", "attention", "norm", "other"

_CLASS_PATTERNS = (
    (ATTENTION, re.compile(r"attn|attention|flash|paged|sdpa|_decode_kernel|_varlen_kernel"
                           r"|_decode_early_kernel|merge_splits", re.I)),
    (NORM, re.compile(r"norm", re.I)),
    (GEMM, re.compile(r"gemm|gemv|nvjet|cutlass|cublas|xmma|aten::(mm|addmm|linear|matmul|bmm)$"
                      r"|splitk|s\d+gemm", re.I)),
)
# Attention kernels that do not read the KV cache themselves (the split-KV merge).
_PARTIAL_ATTENTION = re.compile(r"merge", re.I)
_GEMM_OPS = ("aten::linear", "aten::mm", "aten::addmm")
# The profiler's "Input type" names of floating-point tensors.
_DTYPE_BYTES = {"float": 4, "c10::bfloat16": 2, "c10::half": 2, "double": 8,
                "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1}
# Spec read bandwidths (bytes/s) by a substring of the device name; --bandwidth overrides.
DEVICE_BANDWIDTH = (("H200", 4.8e12), ("H100", 3.35e12), ("A100", 2.0e12), ("L40S", 8.64e11),
                    ("A10", 6.0e11), ("L4", 3.0e11))


def default_bandwidth(device_name: str) -> float | None:
    for key, bw in DEVICE_BANDWIDTH:
        if key.lower() in device_name.lower():
            return bw
    return None


def op_class(name: str) -> str:
    for cls, pattern in _CLASS_PATTERNS:
        if pattern.search(name):
            return cls
    return OTHER


@dataclass(frozen=True)
class ModelShape:
    """What the floors need of a model: its linear weights and attention geometry."""

    linears: dict[str, list[int]] = field(default_factory=dict)  # layer name -> [N, K]
    linear_counts: dict[str, int] = field(default_factory=dict)  # per forward pass
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype_bytes: int = 2  # activations, and weights and KV cache unless given below
    # Bytes per element of linears stored otherwise (FP8: 1), by layer name.
    linear_bytes: dict[str, int] = field(default_factory=dict)
    kv_dtype_bytes: int = 0  # the KV cache's bytes per element; 0: dtype_bytes

    def __post_init__(self) -> None:
        if self.dtype_bytes <= 0 or min(self.num_layers, self.num_kv_heads, self.head_dim) < 0:
            raise ValueError(f"bad model shape: {self}")
        if self.kv_dtype_bytes < 0 or any(b <= 0 for b in self.linear_bytes.values()):
            raise ValueError(f"bad model shape: {self}")
        for name, nk in self.linears.items():
            if len(nk) != 2 or min(nk) <= 0 or self.linear_counts.get(name, 0) <= 0:
                raise ValueError(f"bad linear {name!r} {nk} in the model shape")

    @property
    def weight_bytes(self) -> int:
        """Bytes of every linear weight, read once per forward pass."""
        return sum(math.prod(nk) * self.linear_counts[name] * self.bytes_of(name)
                   for name, nk in self.linears.items())

    def bytes_of(self, layer: str | None) -> int:
        """Bytes per weight element of linear ``layer``."""
        return self.linear_bytes.get(layer, self.dtype_bytes) if layer else self.dtype_bytes

    def kv_bytes(self, tokens: float) -> float:
        """Keys and values of ``tokens`` context tokens in one layer."""
        per = self.kv_dtype_bytes or self.dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * per * tokens

    def layer_of(self, n: int, k: int) -> str | None:
        for name, (wn, wk) in self.linears.items():
            if (wn, wk) == (n, k):
                return name
        return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ModelShape | None:
        return cls(**data) if data else None

    @classmethod
    def from_model(cls, model: Any, dtype_bytes: int, kv_dtype_bytes: int = 0) -> ModelShape:
        """From a cadence model: 2-D weights named ``...<layer>.weight`` (the input embedding
        only when tied to the output head, which then reads all of it), each with its stored
        element size (FP8 projections: 1). Mixture-of-experts weights (3-D) are not counted."""
        linears: dict[str, list[int]] = {}
        counts: dict[str, int] = {}
        sizes: dict[str, int] = {}
        tied = getattr(model, "lm_head", True) is None
        for pname, p in model.named_parameters():
            if p.dim() != 2 or pname.endswith("_scale"):  # FP8 experts' row scales
                continue
            if "embed_tokens" in pname:
                if not tied:
                    continue
                layer = "lm_head"
            else:
                layer = pname.removesuffix(".weight").rsplit(".", 1)[-1]
            linears[layer] = [int(p.shape[0]), int(p.shape[1])]
            counts[layer] = counts.get(layer, 0) + 1
            if p.element_size() != dtype_bytes:
                sizes[layer] = int(p.element_size())
        return cls(linears, counts, int(model.num_layers), int(model.num_kv_heads),
                   int(model.head_dim), dtype_bytes, sizes, kv_dtype_bytes)


@dataclass(frozen=True)
class Floor:
    """The layer op of one call and the bytes it must move (None: not known)."""

    op: str
    bytes: float | None


def _elem(dtypes: tuple, i: int, default: int) -> int:
    if i < len(dtypes):
        return _DTYPE_BYTES.get(dtypes[i].lower(), default)
    return default


def _gemm(name: str, shapes: tuple, dtypes: tuple, shape: ModelShape | None) -> Floor | None:
    dims = [tuple(s) for s in shapes]
    default = shape.dtype_bytes if shape else 2
    if name == "aten::linear" and len(dims) >= 2 and len(dims[1]) == 2 and dims[0]:
        (n, k), m = dims[1], math.prod(dims[0][:-1])
        elem, bias = _elem(dtypes, 1, default), len(dims) > 2 and bool(dims[2])
    elif name in ("aten::mm", "aten::addmm"):
        a, b = (dims[1], dims[2]) if name == "aten::addmm" else (dims[0], dims[1])
        if len(a) != 2 or len(b) != 2:
            return None
        (m, k), n = a, b[1]
        elem, bias = _elem(dtypes, 1 if name == "aten::addmm" else 0, default), name == "aten::addmm"
    else:
        return None
    layer = shape.layer_of(n, k) if shape else None
    label = f"gemm {layer or '?'} M={m} N={n} K={k}"
    return Floor(label, float(elem * (n * k + m * k + m * n + (n if bias else 0))))


def floor_of(name: str, cls: str, host_op: str | None, shapes: tuple, dtypes: tuple,
             shape: ModelShape | None, context_tokens: float | None) -> Floor:
    """The floor of one call of kernel (or host op) ``name`` of class ``cls``; ``host_op``,
    ``shapes`` and ``dtypes`` describe the host op that launched it, when known."""
    if cls == GEMM and host_op in _GEMM_OPS:
        gemm = _gemm(host_op, shapes, dtypes, shape)
        if gemm is not None:
            return gemm
    if cls == NORM and shapes and shapes[0]:
        elem = _elem(dtypes, 0, shape.dtype_bytes if shape else 2)
        weight = math.prod(shapes[1]) if len(shapes) > 1 and shapes[1] else 0
        return Floor(f"norm {list(shapes[0])}", float(elem * (2 * math.prod(shapes[0]) + weight)))
    if (cls == ATTENTION and shape is not None and context_tokens and shape.num_kv_heads
            and not _PARTIAL_ATTENTION.search(name)):
        return Floor("attention (KV read, est.)", shape.kv_bytes(context_tokens))
    return Floor(cls, None)
