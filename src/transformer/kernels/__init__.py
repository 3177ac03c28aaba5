"""The model's computations in the forms a traced graph takes, shared by the two places that
trace one: compiled decoding (:mod:`transformer.compiled`) and training's ``torch.compile``
(:mod:`transformer.train.torch_compile`). Below both, above the model, whose readable forms
they stand in for; neither of the two imports the other.

attention.py: :func:`~transformer.kernels.attention.graph_attention`.
"""
