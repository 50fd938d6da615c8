"""vLLM: the offload-manager adapter (``vllm_adapter``, with the release detection both adapters
use), the GPU prefix-cache adapter (``vllm_prefix_adapter``) and the CPU import-tree builder
(``vllm_standins``, ``python -m kvspec.engines.vllm.vllm_standins WHEEL DEST``)."""
