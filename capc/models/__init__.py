"""Model architectures by name, checkpoints with a model card, and batched inference."""

from capc.models.checkpoint import Teacher, load_teacher, save_teacher
from capc.models.registry import ARCHITECTURES, Classifier, build

__all__ = ["ARCHITECTURES", "Classifier", "Teacher", "build", "load_teacher", "save_teacher"]
