"""Model architectures by name, checkpoints with a model card, batched inference, and a
hospital's own models (ONNX, TorchScript, ``module:factory``) as teachers."""

from capc.models.checkpoint import Teacher, load_teacher, save_teacher
from capc.models.foreign import ForeignTeacher, Interface, load_foreign
from capc.models.registry import ARCHITECTURES, Classifier, build

__all__ = [
    "ARCHITECTURES",
    "Classifier",
    "ForeignTeacher",
    "Interface",
    "Teacher",
    "build",
    "load_foreign",
    "load_teacher",
    "save_teacher",
]
