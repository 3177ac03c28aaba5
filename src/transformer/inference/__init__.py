"""Running a trained or imported model: :class:`~.translator.Translator` (translation),
:class:`~.generator.Generator` (a language model), and :mod:`.front_door`, what both share
(the run folder opened, the model converted for decoding, the precision and compiled step
chosen). Decoding strategies themselves live in :mod:`transformer.decode`."""
