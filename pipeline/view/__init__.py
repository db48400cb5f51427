"""`npucam view`: a live page of what a pipeline publishes, drawn from the wire contract alone.

server.py relays the PUB endpoint's messages to browsers over a WebSocket; static/ holds the
page (plain JavaScript, no build step) that decodes them as docs/protocol.md says and draws
frames, boxes, tracks, skeletons, identities, labels and per-camera stats on canvases.
"""
