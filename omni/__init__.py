"""omni: a serving runtime for omni models (encoders, thinker, talker, vocoder) as stage actors."""

__version__ = "0.1.0"
