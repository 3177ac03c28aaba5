"""Looking inside a model, causally: the trace of every intermediate value by name, with
replacements (:mod:`.trace`), the logit lens (:mod:`.lens`) and head ablation and patching
(:mod:`.heads`), for both model kinds, trained here or imported."""
from .heads import HeadEffects, Score, head_effects, head_kinds
from .lens import Lens, lens_logits, logit_lens
from .trace import Patch, Resume, batch_mean, position_mean, trace, trace_lm, trace_translation, value_names, zero

__all__ = ["trace", "trace_translation", "trace_lm", "value_names", "Patch", "Resume", "zero", "batch_mean",
           "position_mean", "logit_lens", "lens_logits", "Lens", "head_effects", "head_kinds", "HeadEffects", "Score"]
