"""Communication for distributed synchronous SGD with merged gradients (MG-WFBP).

The data flow, one folder a step: `model/` (pure: the profile, the cost T_ar(M), MG-WFBP's
merge and the other schemes, the predicted timeline, the `Plan`), `backends/` (the
communicators: MPI, NCCL, local threads, an emulated network), `runtime/` (the communication
thread that runs a plan each iteration) and `training/` (the trainer that measures, plans,
re-plans and wires them to a solver).
"""
