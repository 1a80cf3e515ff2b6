"""Elementwise epilogues Megatron fuses (``megatron/core/fusions``); here the unfused math."""
