"""NetSpec: write a network in Python and get its NetParameter (pycaffe's caffe.net_spec).

    from mgcaffe import layers as L, params as P, NetSpec
    n = NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[64, 1, 28, 28]), dict(dim=[64])], ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.relu1 = L.ReLU(n.pool1, in_place=True)
    n.loss = L.SoftmaxWithLoss(n.relu1, n.label)
    print(n.to_proto())                  # prototxt text

`L.<Type>(*bottoms, **fields)` makes a layer of that type. Its result is one `Top` (the
default `ntop=1`), a tuple of `ntop` Tops, or, for `ntop=0`, the layer itself. Keyword
fields go into the type's own parameter message (`convolution_param` for Convolution and
Deconvolution, ...) when it has such a field, else into the LayerParameter (`param`,
`loss_weight`, `include`, ...); a keyword ending in `param` always names a LayerParameter
field. Dicts fill sub-messages, lists fill repeated fields (a lone value becomes a one-item
list). `in_place=True` makes the tops the bottoms; `name=` is not special: layer and top
names come from the NetSpec attributes they are assigned to, else `<Type><k>`.
`P.<Type>.<ENUM>` is the enum value of `<Type>Parameter` (`P.Pooling.MAX`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from .proto import caffe_pb2


def _param_field_names() -> dict[str, str]:
    """Layer type -> its parameter field of LayerParameter ('Convolution' -> 'convolution_param'),
    read from the message descriptors."""
    names = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                names[type_name[: -len("Parameter")]] = field.name
    names["Deconvolution"] = "convolution_param"  # Caffe's one type without its own message
    return names


_PARAM_FIELDS = _param_field_names()


def assign_proto(message, name: str, value) -> None:
    """Set field `name` of `message` from a Python value (dict: sub-message, list: repeated)."""
    target = getattr(message, name)
    repeated = hasattr(target, "extend")
    if repeated and not isinstance(value, (list, tuple)):
        value = [value]
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], dict):
            for item in value:
                sub = target.add()
                for key, v in item.items():
                    assign_proto(sub, key, v)
        else:
            target.extend(value)
    elif isinstance(value, dict):
        for key, v in value.items():
            assign_proto(target, key, v)
    else:
        setattr(message, name, value)


class Top:
    """Output `n` of a layer function; what NetSpec attributes hold and layers take."""

    def __init__(self, fn: Function, n: int):
        self.fn = fn
        self.n = n

    def to_proto(self) -> caffe_pb2.NetParameter:
        """The NetParameter of every layer this top depends on."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames) -> None:
        self.fn._to_proto(layers, names, autonames)


class Function:
    """One layer: its type, its input Tops and its fields (see the module docstring)."""

    def __init__(self, type_name: str, inputs, params: dict):
        self.type_name = type_name
        for index, top in enumerate(inputs):
            if not isinstance(top, Top):
                raise TypeError(f"{type_name} input {index} is not a Top "
                                f"(type is {type(top)})")
        self.inputs = tuple(inputs)
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _top_name(self, top: Top, names, autonames) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = f"{top.fn.type_name}{autonames[top.fn.type_name]}"
        return names[top]

    def _layer_name(self, names, autonames) -> str:
        if self not in names and self.ntop > 0:
            names[self] = self._top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = f"{self.type_name}{autonames[self.type_name]}"
        return names[self]

    def _to_proto(self, layers, names, autonames) -> None:
        if self in layers:
            return
        bottoms = []
        for top in self.inputs:
            top._to_proto(layers, names, autonames)
            bottoms.append(layers[top.fn].top[top.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottoms)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            layer.top.extend(self._top_name(top, names, autonames) for top in self.tops)
        layer.name = self._layer_name(names, autonames)
        own = _PARAM_FIELDS.get(self.type_name)
        for key, value in self.params.items():
            if key.endswith("param") or own is None:
                assign_proto(layer, key, value)
                continue
            sub = getattr(layer, own)
            if key in type(sub).DESCRIPTOR.fields_by_name:
                assign_proto(sub, key, value)
            else:
                assign_proto(layer, key, value)
        layers[self] = layer


class NetSpec:
    """Named tops in assignment order; `to_proto()` gives the NetParameter they describe."""

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setitem__(self, key, value):
        self.__setattr__(key, value)

    def __getitem__(self, item):
        return self.__getattr__(item)

    def __delattr__(self, name):
        del self.tops[name]

    def keys(self):
        return list(self.tops)

    def to_proto(self) -> caffe_pb2.NetParameter:
        names = {value: key for key, value in self.tops.items()}
        autonames: Counter = Counter()
        layers: OrderedDict = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


def to_proto(*tops) -> caffe_pb2.NetParameter:
    """The NetParameter of the layers the given tops depend on (names generated)."""
    layers: OrderedDict = OrderedDict()
    autonames: Counter = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class Layers:
    """`L`: `L.Convolution(bottom, ...)` builds a layer function of that type."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops

        layer_fn.__name__ = name
        return layer_fn


class Parameters:
    """`P`: `P.Pooling.MAX` is PoolingParameter.MAX (enum values of the parameter messages)."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter")

        class Param:
            def __getattr__(self, param_name):
                return getattr(message, param_name)

        return Param()


layers = Layers()
params = Parameters()
