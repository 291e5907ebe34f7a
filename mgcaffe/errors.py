"""The few exception types mgcaffe raises; every message names the file, layer, blob or rank."""


class MgcaffeError(Exception):
    """Base of every error mgcaffe reports to a user (the CLI prints it on one line, exits 1)."""


class ParseError(MgcaffeError):
    """A prototxt, .caffemodel, JSON or other input file could not be read as expected."""


class NetError(MgcaffeError):
    """A network definition is inconsistent (unknown blob, bad shape, unsupported feature)."""


class LayerError(NetError):
    """A layer was given parameters or inputs it cannot work with; the message names it."""


class SolverError(MgcaffeError):
    """A solver definition or solver state is invalid, or training diverged."""


class DataError(MgcaffeError):
    """A data source (LMDB, image list, HDF5 file, record) is missing or malformed."""


class CommError(MgcaffeError):
    """Distributed communication failed: a rank, the communication thread or a plan mismatch."""


class PlanError(MgcaffeError):
    """A profile, network description or plan is invalid for planning."""
