"""What the omni families (Qwen3-Omni, Qwen2.5-Omni) share: their request contract, preprocessor and
entry stage, thinker stage, args and graph pieces. A family subclasses these with its own numbers."""
