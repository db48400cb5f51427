"""npucam's engine: messages, bounded queues, graph runner, config, metrics and CLI.

It knows no model: stages/ plug models in, npu/ runs them.
"""
