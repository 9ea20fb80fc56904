"""GGUF block-quantized weights run as they are (see docs/quantization.md).

- quant_tensor.py: `QuantTensor`, a checkpoint tensor still in its GGUF block
  format, which the layers' weight loaders narrow (tensor parallelism) and keep.
- `QuantWeight` (layers/prepared_weight.py, beside the other `PreparedWeight`
  formats): a linear layer's, LM head's or embedding table's blocks repacked for the
  kernels (csrc/quant/).
"""
