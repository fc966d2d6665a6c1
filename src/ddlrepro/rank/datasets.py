"""The real data sets of the accuracy figures (KungFu Fig 4): scikit-learn's bundled digits at smoke scale,
CIFAR-10 from a user's folder at paper scale (never downloaded). Torch-free: the host checks the files with
`check_cifar10` before any job starts."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATASETS = ("digits", "cifar10")
DIGITS_SAMPLES = 1_797
CIFAR10_TRAIN_SAMPLES = 50_000
IMAGE_FOLDER_FILES = ("images.npy", "labels.npy")  # the GAN study's own images (workloads/gan.py)
CIFAR10_FILES = [*(f"data_batch_{index}" for index in range(1, 6)), "test_batch"]
# Each pickled batch holds 10,000 images of 3·32·32 bytes and their labels, and more (file names, a header).
CIFAR10_MIN_BYTES = 10_000 * (3 * 32 * 32 + 1)


@dataclass(frozen=True)
class Split:
    """Images (N, C, H, W) as float32, normalised per channel with the training split's statistics; int64 labels."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def check_image_folder(data_dir: str | Path, resolution: int) -> None:
    """FileNotFoundError/ValueError naming the file in `data_dir` that is missing or not N×3×R×R uint8 images."""
    folder = Path(data_dir)
    for name in IMAGE_FOLDER_FILES:
        if not (folder / name).is_file():
            expected = ", ".join(IMAGE_FOLDER_FILES)
            raise FileNotFoundError(f"{folder / name}: missing ({expected} expected in data_dir; never downloaded)")
    images = np.load(folder / "images.npy", mmap_mode="r")
    labels = np.load(folder / "labels.npy", mmap_mode="r")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (3, resolution, resolution):
        raise ValueError(f"{folder / 'images.npy'}: {images.dtype} {images.shape}, uint8 N×3×{resolution}×{resolution}")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"{folder / 'labels.npy'}: shape {labels.shape}, one label per image ({images.shape[0]})")


def check_cifar10(data_dir: str | Path) -> None:
    """FileNotFoundError naming the first CIFAR-10 python batch that is missing or too small in `data_dir`."""
    folder = Path(data_dir)
    for name in CIFAR10_FILES:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: missing (CIFAR-10's python batches {', '.join(CIFAR10_FILES)} are expected in data_dir; "
                "they are never downloaded)"
            )
        if path.stat().st_size < CIFAR10_MIN_BYTES:
            raise FileNotFoundError(
                f"{path}: {path.stat().st_size} bytes, too small for 10,000 CIFAR-10 images ({CIFAR10_MIN_BYTES})"
            )


@functools.cache
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    hasher = hashlib.sha256()
    for path, _, _ in files:
        with open(path, "rb") as stream:
            hasher.update(hashlib.file_digest(stream, "sha256").digest())
    return hasher.hexdigest()[:16]


def cifar10_digest(data_dir: str | Path) -> str:
    """A digest of CIFAR-10's python batches' contents (computed once per files' size and modification time): it
    identifies the data in a point's id, so new files give new runs, while the folder's path stays out of it."""
    folder = Path(data_dir)
    return _digest(
        tuple(
            (str(folder / name), (folder / name).stat().st_size, (folder / name).stat().st_mtime_ns)
            for name in CIFAR10_FILES
        )
    )


def train_samples(dataset: str, test_fraction: float) -> int:
    """Training samples of a data set (digits: what scikit-learn's split leaves for training)."""
    if dataset == "cifar10":
        return CIFAR10_TRAIN_SAMPLES
    return DIGITS_SAMPLES - math.ceil(DIGITS_SAMPLES * test_fraction)


def load(dataset: str, data_dir: str | None, seed: int, test_fraction: float) -> Split:
    if dataset == "digits":
        return digits(seed, test_fraction)
    if dataset == "cifar10":
        if data_dir is None:
            raise ValueError("dataset cifar10 needs data_dir")
        return cifar10(data_dir)
    raise ValueError(f"unknown dataset {dataset!r}; valid data sets: {', '.join(DATASETS)}")


def digits_train_size(test_fraction: float) -> int:
    """The training samples `digits` keeps: scikit-learn's split rounds the test set up."""
    return DIGITS_SAMPLES - math.ceil(DIGITS_SAMPLES * test_fraction)


def digit_pixels() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8×8 digits, 64 values 0–16 a row, and their int64 labels, as `load_digits` returns them,
    read from the file the package ships without importing it (the import costs a rank ~1.7 s of start-up)."""
    package = importlib.util.find_spec("sklearn")
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("the digits data set is scikit-learn's: install scikit-learn")
    table = np.loadtxt(
        Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=","
    )
    return table[:, :-1], table[:, -1].astype(np.int64)


def digits(seed: int, test_fraction: float) -> Split:
    """scikit-learn's 1,797 8×8 digits (values 0–16), one grey channel; a seeded stratified split."""
    from sklearn.model_selection import train_test_split

    images, labels = digit_pixels()
    images = images.reshape(-1, 1, 8, 8).astype(np.float32) / 16.0
    train, test, train_labels, test_labels = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    return normalised(train, train_labels, test, test_labels)


def cifar10(data_dir: str | Path) -> Split:
    """CIFAR-10's python batches: 50,000 training and 10,000 test images, 3×32×32."""
    check_cifar10(data_dir)
    batches = [_cifar_batch(Path(data_dir) / name) for name in CIFAR10_FILES]
    train = np.concatenate([images for images, _ in batches[:-1]])
    train_labels = np.concatenate([labels for _, labels in batches[:-1]])
    return normalised(train, train_labels, *batches[-1])


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with path.open("rb") as file:
        batch = pickle.load(file, encoding="bytes")  # the data set's own format (trusted, user-provided files)
    images = np.asarray(batch[b"data"], dtype=np.float32).reshape(-1, 3, 32, 32) / 255.0
    return images, np.asarray(batch[b"labels"], dtype=np.int64)


def normalised(train: np.ndarray, train_labels: np.ndarray, test: np.ndarray, test_labels: np.ndarray) -> Split:
    mean = train.mean(axis=(0, 2, 3), keepdims=True)
    std = train.std(axis=(0, 2, 3), keepdims=True)
    return Split(
        ((train - mean) / std).astype(np.float32),
        np.asarray(train_labels, dtype=np.int64),
        ((test - mean) / std).astype(np.float32),
        np.asarray(test_labels, dtype=np.int64),
    )
