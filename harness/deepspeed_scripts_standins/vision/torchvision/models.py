"""Small classifiers with torchvision's attribute layout (`features`, `avgpool`,
`classifier`), which the pipeline script splits into layers. Sized for a CPU run: a few
thousand parameters, not AlexNet's 61 million."""

import torch
from torch import nn


class AlexNet(nn.Module):
    def __init__(self, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(8, 16, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(16 * 6 * 6, 64), nn.ReLU(inplace=True),
            nn.Linear(64, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg19(num_classes=1000, **_):
    return AlexNet(num_classes=num_classes)


def resnet18(num_classes=1000, **_):
    return AlexNet(num_classes=num_classes)
