"""The sm_90 (Hopper) kernels: stage 1 in Gluon (`stage1`, with the V paths of `vpaths`, the stores of `epilogue` and
the token-table copies of `tokenrows`), the Gluon reduce (`reduce`), their host side (`host`: refusals, per-plan
tables, launch), the per-CTA time line (`timeline`) and the compile report (`build`). docs/kernels.md explains how
they execute a WorkPlan.

Only `host` and `timeline` load without Triton's Gluon; the kernel modules are imported when a launch needs them.
"""
