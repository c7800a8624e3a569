"""Array helpers: which library an array comes from, allocation of outputs like an input, and
the CUDA stream torch orders work on. numpy is needed; torch is optional (imported lazily)."""

import sys

import numpy as np

# kvc dtype names -> numpy / torch dtype attribute names. numpy has no bfloat16: kvc reads a
# uint16 numpy array as bfloat16 bit patterns (to_bf16_bits / from_bf16_bits convert).
_NUMPY = {"f16": "float16", "bf16": "uint16", "f32": "float32", "i32": "int32", "i8": "int8",
          "u8": "uint8"}
_TORCH = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "i32": "int32",
          "i8": "int8", "u8": "uint8"}


def is_torch(x):
    """True for a torch.Tensor (without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def device_name(device):
    """'cpu' / 'cuda:N' for a string, a torch.device or anything whose str() is one."""
    name = str(device)
    return "cuda:0" if name == "cuda" else name


def device_of(x):
    """The kvc device name of an array: 'cpu' for numpy, 'cuda:N' for a CUDA tensor."""
    if is_torch(x):
        return device_name(x.device)
    return "cpu"


def dtype_name(x):
    """The kvc dtype name ('f16', 'bf16', 'f32', ...) of an array's dtype."""
    if is_torch(x):
        for name, attr in _TORCH.items():
            if x.dtype == getattr(sys.modules["torch"], attr):
                return name
        raise TypeError(f"torch dtype {x.dtype} has no kvc name")
    for name, attr in _NUMPY.items():
        if x.dtype == np.dtype(attr):
            return name
    raise TypeError(f"numpy dtype {x.dtype} has no kvc name")


def empty_like(like, shape, dtype):
    """An uninitialised array of `shape` and kvc dtype name `dtype`, from the library and on the
    device of `like` (numpy for anything that is not a torch tensor)."""
    shape = tuple(int(s) for s in shape)
    if is_torch(like):
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, _TORCH[dtype]), device=like.device)
    if dtype not in _NUMPY:
        raise TypeError(f"numpy has no dtype for kvc dtype {dtype}; use torch tensors")
    return np.empty(shape, dtype=_NUMPY[dtype])


def array_like(like, values, dtype):
    """An array of `values` (a list) of kvc dtype name `dtype`, from the library and on the
    device of `like`."""
    if is_torch(like):
        torch = sys.modules["torch"]
        return torch.tensor(values, dtype=getattr(torch, _TORCH[dtype]), device=like.device)
    return np.asarray(values, dtype=_NUMPY[dtype])


def to_bf16_bits(x):
    """bfloat16 bit patterns (a uint16 numpy array) of the values of `x`, rounded to nearest even
    as a float32 -> bfloat16 cast rounds; NaN stays NaN. kvc reads uint16 arrays as bfloat16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x0040), rounded)
    return bits.astype(np.uint16)


def from_bf16_bits(bits):
    """The float32 values of bfloat16 bit patterns (a uint16 array)."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def stream_of(x):
    """The integer cudaStream_t handle of torch's current stream on a CUDA tensor's device, or 0
    (the default stream) for anything else."""
    if is_torch(x) and x.is_cuda:
        return sys.modules["torch"].cuda.current_stream(x.device).cuda_stream
    return 0
