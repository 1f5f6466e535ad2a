"""The multi-codebook talker every family with one shares (DESIGN: "Talker + code predictor"): an
AR-engine model that samples code group 0 of a codec frame and fills groups 1..G-1 with the code
predictor right after (`model`, `code_predictor`, `code_predictor_graphs`), its per-request state
(`request`), a stage base on the AR engine (`stage`) and its typed args (`args`). A family
subclasses the model and the stage with its own layers, prompt rows and inputs."""
