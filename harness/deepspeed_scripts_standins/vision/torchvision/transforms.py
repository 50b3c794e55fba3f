"""The transforms the scripts compose, on PIL images and tensors."""

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, image):
        array = np.asarray(image, dtype=np.float32) / 255.0
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.transpose(2, 0, 1).copy())


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class Resize:
    """An int resizes the shorter side to it, a pair sets (height, width)."""

    def __init__(self, size):
        self.size = size

    def __call__(self, x):
        if isinstance(x, Image.Image):
            w, h = x.size
            if isinstance(self.size, int):
                s = self.size
                size = (s, max(1, round(h * s / w))) if w <= h else (max(1, round(w * s / h)), s)
            else:
                size = (self.size[1], self.size[0])
            return x.resize(size, Image.BILINEAR)
        h, w = x.shape[-2:]
        if isinstance(self.size, int):
            s = self.size
            size = (max(1, round(h * s / w)), s) if w <= h else (s, max(1, round(w * s / h)))
        else:
            size = tuple(self.size)
        return F.interpolate(x[None], size=size, mode="bilinear", align_corners=False)[0]


class CenterCrop:
    def __init__(self, size):
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, x):
        th, tw = self.size
        if isinstance(x, Image.Image):
            w, h = x.size
            left, top = (w - tw) // 2, (h - th) // 2
            return x.crop((left, top, left + tw, top + th))
        h, w = x.shape[-2:]
        top, left = (h - th) // 2, (w - tw) // 2
        return x[..., top:top + th, left:left + tw]


class RandomCrop(CenterCrop):
    """Crops the centre (a fixed crop keeps runs comparable); padding is applied first."""

    def __init__(self, size, padding=None, **_):
        super().__init__(size)
        self.padding = padding

    def __call__(self, x):
        if self.padding and not isinstance(x, Image.Image):
            x = F.pad(x, [self.padding] * 4)
        return super().__call__(x)


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, x):
        return x  # no flip: the runs stay deterministic
