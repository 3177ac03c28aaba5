"""Training: loss, schedule and (in trainer.py) the training loop."""
from .loss import label_smoothed_nll_loss
from .schedule import cooldown_factor, dropout_ramp, inverse_sqrt_lr, linear_decay_lr, noam_lr, paper_adam_kwargs

__all__ = ["label_smoothed_nll_loss", "noam_lr", "inverse_sqrt_lr", "linear_decay_lr", "cooldown_factor",
           "dropout_ramp", "paper_adam_kwargs"]
