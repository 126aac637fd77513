"""One model on several processes: tensor parallelism and expert parallelism with torch.distributed.

- ``launch``: start N ranks on 127.0.0.1 (torch.multiprocessing, spawn), join them, always clean up.
- ``tensor``: the course's Llama split Megatron-style (column- then row-parallel linears, one
  all-reduce after attention and one after the MLP), with KV heads split or replicated.
- ``expert``: a Mixtral-style MoE layer whose experts live on different ranks; tokens go to their
  experts and come back with all-to-all.
- ``runs``: the rank programs (what each process does in a run), compared with one process.
- ``bench``: the all-reduce's bytes per token and time per call, written to ``data/measurements``.
- ``pipeline``: how busy pipeline stages are, in a flushed batch (GPipe) and in a decoding
  pipeline that never drains, and what a token waits (formulas, no processes).
- ``bench_dispatch``: expert parallelism's dispatch bytes per token against the uniform-routing
  prediction, and the router's imbalance.

The ranks talk over gloo on the CPU and over NCCL when their tensors are on CUDA devices.
"""
