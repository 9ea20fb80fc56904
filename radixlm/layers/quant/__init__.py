"""GGUF block-quantized weights run as they are (see docs/quantization.md).

- quant_tensor.py: `QuantTensor`, a checkpoint tensor still in its GGUF block
  format, which the layers' weight loaders narrow (tensor parallelism) and keep.
- quant_weight.py: `QuantWeight`, the `PreparedWeight` of a linear layer, LM head
  or embedding table repacked for the kernels (csrc/quant/).
"""
