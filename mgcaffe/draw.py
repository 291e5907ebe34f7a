"""Draw a network as a graph (pycaffe's caffe.draw): layers as boxes, blobs as octagons.

The graph is written in Graphviz's DOT language by this module (`get_dot_source`, pure
text, no dependency); images (png, svg, pdf, ...) are rendered by Graphviz's `dot` program,
which must be installed (`apt-get install graphviz`, `brew install graphviz`, ...). Asking
for the extension "dot" (or "gv") returns the DOT source without needing it.
`get_pydot_graph` gives a pydot graph, for code written against pycaffe, when pydot is
installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from .errors import MgcaffeError
from .formats.protoio import layer_included
from .proto import caffe_pb2

LAYER_STYLE = {"shape": "box", "fillcolor": "#6495ED", "style": "filled"}
NEURON_STYLE = {"shape": "box", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}
_TYPE_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
                "InnerProduct": "#CC33FF"}
_TEXT_FORMATS = ("dot", "gv")


class DrawError(MgcaffeError):
    """The graph could not be rendered (Graphviz's `dot` missing or failing)."""


def choose_color_by_layertype(layertype: str) -> str:
    """Fill colour of a layer's box: convolutions red, pooling orange, inner products
    purple, the others blue."""
    return _TYPE_COLORS.get(layertype, "#6495ED")


def _first(values, default=0):
    values = list(values)
    return values[0] if values else default


def get_layer_label(layer, rankdir: str, display_lrm: bool = False) -> str:
    """The text of a layer's box: name, type and, for convolution and pooling, geometry;
    with display_lrm, each parameter's lr_mult and decay_mult."""
    sep = "\n" if rankdir in ("LR", "RL") else " "
    parts = [layer.name, f"({layer.type})"]
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        parts += [f"kernel size: {_first(p.kernel_size, p.kernel_h)}",
                  f"stride: {_first(p.stride, p.stride_h or 1)}",
                  f"pad: {_first(p.pad, p.pad_h)}"]
    elif layer.type == "Pooling":
        p = layer.pooling_param
        method = caffe_pb2.PoolingParameter.PoolMethod.Name(p.pool)
        parts += [f"pool: {method}", f"kernel size: {p.kernel_size or p.kernel_h}",
                  f"stride: {p.stride}", f"pad: {p.pad or p.pad_h}"]
    if display_lrm:
        for i, spec in enumerate(layer.param):
            parts.append(f"param {i}: lr_mult {spec.lr_mult:g}, decay_mult {spec.decay_mult:g}")
    return sep.join(parts)


def get_edge_label(layer) -> str:
    """Edges from data layers say the batch size, others are unlabelled (pycaffe)."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return ""


def _quote(text: str) -> str:
    text = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _attrs(attrs: dict) -> str:
    return ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items())


def _layers(net: caffe_pb2.NetParameter, phase):
    layers = list(net.layer)
    if phase is None:
        return layers
    state = caffe_pb2.NetState(phase=phase)
    return [layer for layer in layers if layer_included(layer, state)]


def get_dot_source(net: caffe_pb2.NetParameter, rankdir: str = "LR", label_edges: bool = True,
                   phase=None, display_lrm: bool = False) -> str:
    """The network as a DOT graph: one node per layer and per blob, edges bottom blob ->
    layer -> top blob (an in-place layer's top is its bottom's node). `phase`:
    caffe_pb2.TRAIN or TEST keeps the layers of that phase (None: all)."""
    name = net.name or "Network"
    lines = [f"digraph {_quote(name)} {{", f"  graph [{_attrs({'rankdir': rankdir})}];"]
    blobs: dict[str, str] = {}
    edges = []
    for index, layer in enumerate(_layers(net, phase)):
        node = f"layer{index}_{layer.name}"
        style = dict(LAYER_STYLE, fillcolor=choose_color_by_layertype(layer.type))
        if len(layer.bottom) == 1 and list(layer.bottom) == list(layer.top):
            style = dict(NEURON_STYLE)
        style["label"] = get_layer_label(layer, rankdir, display_lrm)
        lines.append(f"  {_quote(node)} [{_attrs(style)}];")
        for bottom in layer.bottom:
            blobs.setdefault(bottom, f"blob_{bottom}")
            edges.append((blobs[bottom], node, ""))
        label = get_edge_label(layer) if label_edges else ""
        for top in layer.top:
            blobs.setdefault(top, f"blob_{top}")
            if top in layer.bottom:
                continue  # in place: the box sits on its blob's edge
            edges.append((node, blobs[top], label))
    for blob, node in blobs.items():
        lines.append(f"  {_quote(node)} [{_attrs(dict(BLOB_STYLE, label=blob))}];")
    for src, dst, label in edges:
        extra = f" [{_attrs({'label': label})}]" if label else ""
        lines.append(f"  {_quote(src)} -> {_quote(dst)}{extra};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def get_pydot_graph(net, rankdir: str = "LR", label_edges: bool = True, phase=None,
                    display_lrm: bool = False):
    """The graph as a pydot.Dot (needs the pydot package)."""
    try:
        import pydot  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise DrawError("get_pydot_graph needs pydot (pip install pydot); "
                        "get_dot_source gives the same graph as text") from exc
    return pydot.graph_from_dot_data(get_dot_source(net, rankdir, label_edges, phase,
                                                    display_lrm))[0]


def render(source: str, ext: str) -> bytes:
    """Render DOT source to format `ext` with Graphviz's `dot`."""
    ext = ext.lstrip(".").lower()
    if ext in _TEXT_FORMATS:
        return source.encode()
    dot = shutil.which("dot")
    if dot is None:
        raise DrawError(f"drawing a .{ext} needs Graphviz's `dot` program, which is not "
                        "installed (e.g. apt-get install graphviz); a .dot file needs nothing")
    done = subprocess.run([dot, f"-T{ext}"], input=source.encode(), capture_output=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        raise DrawError(f"dot -T{ext} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def draw_net(net, rankdir: str, ext: str = "png", phase=None, display_lrm: bool = False) -> bytes:
    """The network drawn in format `ext` (bytes), pycaffe's caffe.draw.draw_net."""
    return render(get_dot_source(net, rankdir, True, phase, display_lrm), ext)


def draw_net_to_file(net, filename, rankdir: str = "LR", phase=None,
                     display_lrm: bool = False) -> None:
    """Draw the network to `filename`, in the format its extension names."""
    ext = os.path.splitext(str(filename))[1].lstrip(".") or "png"
    data = draw_net(net, rankdir, ext, phase, display_lrm)
    with open(filename, "wb") as f:
        f.write(data)
