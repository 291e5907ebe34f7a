"""WindowData: R-CNN style windows cropped from images listed in a window file (Caffe's).

The window file (window_data_param.source) holds, per image:

    # image_index
    image_path            (root_folder is prepended as a string)
    channels height width
    num_windows
    class_index overlap x1 y1 x2 y2     (one line per window, pixel corners inclusive)

Windows with overlap >= fg_threshold are foreground (their class must be > 0); those with
overlap < bg_threshold are background (label 0). Each batch holds batch_size - int(batch_size
* fg_fraction) background windows, then the foreground ones, each drawn uniformly at random.
A window is optionally grown by context_pad (and made square with crop_mode "square"), clipped
to the image, warped (bilinear) to transform_param.crop_size, mirrored with probability 1/2
when transform_param.mirror is set, placed in a zeroed crop_size x crop_size canvas, then mean
subtracted (transform_param.mean_file, at the canvas offsets, or mean_value) and multiplied by
window_data_param.scale. Tops: data (batch, channels, crop, crop), label (batch,).
"""

from __future__ import annotations

import math

import numpy as np

from ..data.image import Image, decode_image
from ..data.transformer import read_mean_file
from ..errors import DataError
from .data import BasePrefetchingDataLayer, transform_param_of
from .registry import register_layer


def c_round(x: float) -> int:
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def read_window_file(path: str, root: str, fg_threshold: float, bg_threshold: float, what):
    """(images [(path, (c, h, w))], foreground windows, background windows); a window is
    (image index, label, overlap, x1, y1, x2, y2)."""
    try:
        with open(path, encoding="utf-8") as f:
            tokens = f.read().split()
    except OSError as exc:
        raise DataError(f"{what}: failed to open window file {path!r} ({exc})") from None
    if not tokens:
        raise DataError(f"{what}: window file {path!r} is empty")
    images, fg, bg = [], [], []
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(tokens):
            raise DataError(f"{what}: window file {path!r} ends in the middle of image "
                            f"{len(images)}'s entry")
        pos += n
        return tokens[pos - n:pos]

    try:
        while pos < len(tokens):
            hashtag, index = take(2)
            if hashtag != "#":
                raise DataError(f"{what}: window file {path!r}: expected '#' before image "
                                f"{len(images)}, found {hashtag!r}")
            image_path, c, h, w, count = take(5)
            images.append((root + image_path, (int(c), int(h), int(w))))
            for _ in range(int(count)):
                label, overlap, x1, y1, x2, y2 = take(6)
                window = (int(index), int(label), float(overlap), int(x1), int(y1), int(x2),
                          int(y2))
                if window[2] >= fg_threshold:
                    if window[1] <= 0:
                        raise DataError(f"{what}: window file {path!r}: foreground window of "
                                        f"image {index} has class {label}, expected > 0")
                    fg.append(window)
                elif window[2] < bg_threshold:
                    bg.append((window[0], 0, 0.0) + window[3:])
    except ValueError as exc:
        raise DataError(f"{what}: window file {path!r}: {exc}") from None
    return images, fg, bg


@register_layer
class WindowData(BasePrefetchingDataLayer):
    """Random foreground/background windows of the images in a window file."""

    type = "WindowData"
    exact_num_top = 2

    def data_setup(self, top):
        p = self.param.window_data_param
        self.what = f"layer {self.name!r} (WindowData)"
        if not p.source:
            raise self.error("window_data_param.source is not set")
        if p.batch_size <= 0:
            raise self.error("window_data_param.batch_size must be positive")
        tp = transform_param_of(self.param, p)
        self.crop_size = int(tp.crop_size)
        if self.crop_size <= 0:
            raise self.error("transform_param.crop_size must be positive")
        self.mirror = bool(tp.mirror)
        self.scale = float(p.scale)
        self.batch_size = int(p.batch_size)
        self.fg_fraction = float(p.fg_fraction)
        self.context_pad = int(p.context_pad)
        self.square = p.crop_mode == "square"
        self.images, self.fg, self.bg = read_window_file(
            p.source, p.root_folder, p.fg_threshold, p.bg_threshold, self.what)
        channels = self.images[-1][1][0]
        self.mean = None
        if tp.mean_file and len(tp.mean_value):
            raise self.error("cannot specify mean_file and mean_value at the same time")
        if tp.mean_file:
            self.mean = read_mean_file(tp.mean_file).astype(self.dtype)
        self.mean_values = np.asarray(tp.mean_value, dtype=self.dtype)
        if self.mean_values.size not in (0, 1, channels):
            raise self.error(f"specify either 1 mean_value or as many as channels: {channels}")
        if self.mean_values.size == 1:
            self.mean_values = np.repeat(self.mean_values, channels)
        self.cache = None
        if p.cache_images:
            self.cache = []
            for path, _ in self.images:
                try:
                    with open(path, "rb") as f:
                        self.cache.append(f.read())
                except OSError as exc:
                    raise DataError(f"{self.what}: could not open or find file {path!r} "
                                    f"({exc})") from None
        self._rng = self.transform_rng()
        return [(self.batch_size, channels, self.crop_size, self.crop_size),
                (self.batch_size,)]

    def _rand(self) -> int:
        return int(self._rng.integers(0, 2**32))

    def load_batch(self):
        if not self.fg or not self.bg:
            raise DataError(f"{self.what}: needs both foreground ({len(self.fg)}) and "
                            f"background ({len(self.bg)}) windows")
        data = np.zeros((self.batch_size,) + self.top_shapes[0][1:], dtype=self.dtype)
        labels = np.empty((self.batch_size,), dtype=self.dtype)
        num_fg = int(self.batch_size * self.fg_fraction)
        item = 0
        for pool, count in ((self.bg, self.batch_size - num_fg), (self.fg, num_fg)):
            for _ in range(count):
                window = pool[self._rand() % len(pool)]
                mirror = self.mirror and self._rand() % 2 == 1
                self._fill(data[item], window, mirror)
                labels[item] = window[1]
                item += 1
        return data, labels

    def _fill(self, out, window, mirror):
        index, _, _, x1, y1, x2, y2 = window
        path = self.images[index][0]
        source = self.cache[index] if self.cache is not None else path
        image = decode_image(source, color=True, what=f"{self.what}: image {path!r}")
        _, rows, cols = image.shape
        crop = self.crop_size
        size = (crop, crop)  # (width, height) of the warped window
        pad_w = pad_h = 0
        if self.context_pad > 0 or self.square:
            context_scale = crop / (crop - 2 * self.context_pad)
            half_h, half_w = (y2 - y1 + 1) / 2.0, (x2 - x1 + 1) / 2.0
            centre_x, centre_y = x1 + half_w, y1 + half_h
            if self.square:
                half_h = half_w = max(half_h, half_w)
            x1 = c_round(centre_x - half_w * context_scale)
            x2 = c_round(centre_x + half_w * context_scale)
            y1 = c_round(centre_y - half_h * context_scale)
            y2 = c_round(centre_y + half_h * context_scale)
            unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            scale_x, scale_y = crop / unclipped_w, crop / unclipped_h
            width = c_round((x2 - x1 + 1) * scale_x)
            height = c_round((y2 - y1 + 1) * scale_y)
            pad_x1, pad_x2 = c_round(pad_x1 * scale_x), c_round(pad_x2 * scale_x)
            pad_y1 = c_round(pad_y1 * scale_y)
            pad_h = pad_y1
            pad_w = pad_x2 if mirror else pad_x1
            height = min(height, crop - pad_h)
            width = min(width, crop - pad_w)
            size = (width, height)
        if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows):
            raise DataError(f"{self.what}: window ({x1}, {y1}, {x2}, {y2}) lies outside image "
                            f"{path!r} of {cols}x{rows}")
        region = image[:, y1:y2 + 1, x1:x2 + 1]
        warped = _resize_chw(region, size[1], size[0])
        if mirror:
            warped = warped[:, :, ::-1]
        _, h, w = warped.shape
        values = warped.astype(self.dtype)
        if self.mean is not None:
            off = (self.mean.shape[2] - crop) // 2
            values = values - self.mean[:, off + pad_h:off + pad_h + h, off + pad_w:off + pad_w + w]
        elif self.mean_values.size:
            values = values - self.mean_values[:, None, None]
        out[:, pad_h:pad_h + h, pad_w:pad_w + w] = values * self.dtype.type(self.scale)


def _resize_chw(chw: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of a CHW uint8 array to (height, width)."""
    if chw.shape[1:] == (height, width):
        return chw
    if chw.shape[0] == 1:
        img = Image.fromarray(chw[0])
        return np.asarray(img.resize((width, height), Image.BILINEAR))[None]
    img = Image.fromarray(np.ascontiguousarray(chw.transpose(1, 2, 0)))
    return np.asarray(img.resize((width, height), Image.BILINEAR)).transpose(2, 0, 1)
