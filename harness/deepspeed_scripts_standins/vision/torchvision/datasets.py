"""Offline image datasets: deterministic random PIL images instead of a download."""

import numpy as np
from PIL import Image
from torch.utils.data import Dataset


class _RandomImages(Dataset):
    def __init__(self, size, shape, num_classes, seed, transform=None, target_transform=None):
        rng = np.random.default_rng(seed)
        channels, height, width = shape
        self.data = rng.integers(0, 256, size=(size, height, width, channels), dtype=np.uint8)
        self.targets = rng.integers(0, num_classes, size=size).tolist()
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        pixels = self.data[index]
        image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
        target = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class CIFAR10(_RandomImages):
    """64 random 32x32 RGB images in 10 classes (the real one: 50,000 / 10,000, downloaded)."""

    classes = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False):
        super().__init__(64, (3, 32, 32), 10, 0 if train else 1, transform, target_transform)


class MNIST(_RandomImages):
    def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False):
        super().__init__(64, (1, 28, 28), 10, 2 if train else 3, transform, target_transform)


class FakeData(_RandomImages):
    def __init__(self, size=64, image_size=(3, 224, 224), num_classes=10, transform=None,
                 target_transform=None, random_offset=0):
        super().__init__(size, image_size, num_classes, random_offset, transform, target_transform)
