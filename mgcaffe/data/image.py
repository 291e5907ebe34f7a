"""Image decoding with Pillow into Caffe's layout: uint8, channels first, colour as BGR.

Caffe reads images with OpenCV, which returns BGR; nets trained with Caffe expect that
channel order, so we flip Pillow's RGB.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from ..errors import DataError


class _LazyImage:
    """PIL.Image, imported on first use: importing mgcaffe needs no Pillow."""

    def __getattr__(self, name):
        from PIL import Image as pil_image  # noqa: PLC0415 - optional at import time

        return getattr(pil_image, name)


Image = _LazyImage()

_GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


def _to_uint8_gray(img: Any) -> np.ndarray:
    """An HxW uint8 array of a single-channel image (16-bit and float reduced like OpenCV)."""
    if img.mode in ("1", "L", "LA"):
        return np.asarray(img.convert("L"))
    arr = np.asarray(img)
    if img.mode.startswith("I;16") or (img.mode == "I" and arr.max(initial=0) > 255):
        # OpenCV without IMREAD_ANYDEPTH keeps the high byte of 16-bit samples.
        return (arr.astype(np.uint32) >> 8).astype(np.uint8)
    return np.clip(arr, 0, 255).astype(np.uint8)


def convert_mode(img: Any, color: bool | None = None) -> Any:
    """The image in mode "RGB" or "L", as OpenCV's imread flags would give it.

    color True: 3 channels (grey replicated); False: 1 channel (ITU-R 601 luma, as OpenCV);
    None: the file's own ("native"): 1 channel for grey images, else 3 (alpha dropped).
    """
    gray_native = img.mode in _GRAY_MODES
    if gray_native:
        gray = Image.fromarray(_to_uint8_gray(img))
        return gray.convert("RGB") if color else gray
    return img.convert("L") if color is False else img.convert("RGB")


def pil_to_chw(img: Any, color: bool | None = None) -> np.ndarray:
    """Pillow image -> CHW uint8 array (BGR when 3 channels); `color` as in convert_mode."""
    hwc = np.asarray(convert_mode(img, color))
    if hwc.ndim == 2:
        return np.ascontiguousarray(hwc[None, :, :])
    return np.ascontiguousarray(hwc[:, :, ::-1].transpose(2, 0, 1))


def resize_image(img: Any, new_height: int, new_width: int) -> Any:
    """Resize to new_height x new_width (bilinear, as Caffe's cv::resize default); 0 = keep."""
    if new_height <= 0 and new_width <= 0:
        return img
    if new_height <= 0 or new_width <= 0:
        raise DataError(f"new_height ({new_height}) and new_width ({new_width}) must be set "
                        "together (Caffe requires both or neither)")
    return img.resize((int(new_width), int(new_height)), Image.BILINEAR)


def decode_image(source, color: bool | None = None, new_height: int = 0, new_width: int = 0,
                 what: str = "") -> np.ndarray:
    """Decode a path or encoded bytes (JPEG, PNG, ...) into a CHW uint8 array.

    As Caffe's ReadImageToCVMat: decode in the requested colour mode, then resize.
    `what` names the record or list line in error messages.
    """
    label = what or (os.fspath(source) if not isinstance(source, bytes) else "encoded image")
    try:
        handle = io.BytesIO(source) if isinstance(source, bytes) else source
        with Image.open(handle) as img:
            img.load()
            converted = convert_mode(img, color)
    except FileNotFoundError:
        raise DataError(f"{label}: image file not found") from None
    except (OSError, ValueError, SyntaxError) as exc:  # PIL's UnidentifiedImageError too
        raise DataError(f"{label}: cannot decode image ({exc})") from None
    return pil_to_chw(resize_image(converted, new_height, new_width))


def encode_image(chw: np.ndarray, fmt: str = "PNG") -> bytes:
    """Encode a CHW uint8 array (BGR if 3 channels) as PNG/JPEG bytes."""
    chw = np.asarray(chw)
    if chw.dtype != np.uint8 or chw.ndim != 3 or chw.shape[0] not in (1, 3):
        raise DataError(f"encode_image needs a 1- or 3-channel CHW uint8 array, got "
                        f"{chw.dtype} {chw.shape}")
    if chw.shape[0] == 1:
        img = Image.fromarray(chw[0])
    else:
        img = Image.fromarray(np.ascontiguousarray(chw[::-1].transpose(1, 2, 0)))
    buf = io.BytesIO()
    fmt = fmt.upper().lstrip(".")
    img.save(buf, format="JPEG" if fmt == "JPG" else fmt)
    return buf.getvalue()
