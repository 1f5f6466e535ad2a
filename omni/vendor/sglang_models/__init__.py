"""Model classes omni adds to SGLang's registry (part of the vendor layer: they import SGLang).

SGLang imports every module here, in each of its processes, when `SGLANG_EXTERNAL_MODEL_PACKAGE`
names this package (`omni.vendor.sglang.taps_server_args` sets it); nothing else imports them.
"""
