"""kvc: KV-cache compression primitives for inference engines, from Python.

A thin layer over the C++ objects (kvc._kvc, nanobind over DLPack): torch tensors (CPU or CUDA)
and numpy arrays (CPU) pass without copies; bad arguments raise kvc.Error (a ValueError) with
the C++ message. Methods that produce tensors allocate them with the library of their input
(numpy in, numpy out; torch in, torch out on the same device) unless an `out` is given. Work on
CUDA tensors is ordered on torch's current stream of their device. numpy has no bfloat16: kvc
reads a uint16 numpy array as bfloat16 bit patterns (to_bf16_bits, from_bf16_bits). DeepSeek-V4's
compressed attention is the submodule kvc.dsv4.
"""

from . import _kvc
from ._kvc import (
    AttentionConfig,
    AttentionMode,
    BlockIndexConfig,
    DType,
    Error,
    Footprint,
    Format,
    GqaAggregate,
    ErrorBits,
    IndexKernel,
    KvStoreConfig,
    LayeredCacheConfig,
    PageOwner,
    RepresentativePolicy,
    SelectorLimits,
    SelectPolicy,
    SlotState,
    SummaryScore,
    SUMMARY_MEAN_K,
    SUMMARY_MEAN_V,
    SUMMARY_MIN_MAX_K,
    SUMMARY_INDEX_KEYS,
    MAX_CANDIDATES,
    TokenKeys,
    compute_footprint,
    cuda_device_count,
    default_device,
    planner,
    select_row,
    uses_selection,
)
from . import dsv4
from ._arrays import from_bf16_bits, to_bf16_bits
from ._objects import (
    AttentionBackend,
    BlockIndex,
    KvStore,
    LayeredCache,
    Selector,
    merge_states,
    merge_states_inplace,
)

cuda_enabled = _kvc.cuda_enabled

__all__ = [
    "AttentionBackend",
    "AttentionConfig",
    "AttentionMode",
    "BlockIndex",
    "BlockIndexConfig",
    "DType",
    "Error",
    "Footprint",
    "Format",
    "GqaAggregate",
    "IndexKernel",
    "KvStore",
    "ErrorBits",
    "KvStoreConfig",
    "LayeredCache",
    "LayeredCacheConfig",
    "PageOwner",
    "RepresentativePolicy",
    "SelectPolicy",
    "Selector",
    "SelectorLimits",
    "SlotState",
    "SummaryScore",
    "SUMMARY_MEAN_K",
    "SUMMARY_MEAN_V",
    "SUMMARY_MIN_MAX_K",
    "SUMMARY_INDEX_KEYS",
    "MAX_CANDIDATES",
    "TokenKeys",
    "compute_footprint",
    "cuda_device_count",
    "cuda_enabled",
    "default_device",
    "dsv4",
    "from_bf16_bits",
    "merge_states",
    "merge_states_inplace",
    "planner",
    "select_row",
    "to_bf16_bits",
    "uses_selection",
]
