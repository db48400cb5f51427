"""The kinds of camera source, one module each, each a SourceKind in the registry
(registry.py) that owns its url scheme: parsing and checking the url, `validate`'s check that
its file or folder is there, opening and reading it, and how `npucam plan` probes it. The
reader around them is stages/sources.py.

url forms:
    PATH, file:PATH          video file (relative to base_dir)                      file.py
    sample:NAME              pipeline.assets.asset_path(NAME), e.g. sample:bikes.mp4  file.py
    usb:N                    USB/V4L2 device index N                                  usb.py
    rtsp://, rtsps://, http://, https://
                             anything FFmpeg opens through cv2.VideoCapture (incl. HTTP
                             MJPEG)                                                   stream.py
    images:DIR               the image files of DIR in sorted order, paced by `fps`   images.py
    zmq:tcp://HOST:PORT      PULL frames a remote capture process PUSHes           zmq_pull.py
    synthetic:[?width=W&height=H&fps=F]
                             a deterministic moving test card with the seq drawn in it
                                                                                  synthetic.py
"""
