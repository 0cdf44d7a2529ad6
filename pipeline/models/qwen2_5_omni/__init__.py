"""qwen2_5_omni"""
