"""Recording and replay (docs/recording.md): the `record` stage writes each camera's frames and
every published message to bounded, segmented logs; `npucam replay` and the `recording:`
camera source read them back."""
