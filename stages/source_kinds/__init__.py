"""The kinds of camera source (files, USB devices, streams, image folders, ZeroMQ feeds, the
test card), one module each; stages/sources.py reads any of them."""
