"""An RTSP camera on loopback for the tests: GStreamer's RTSP server (Debian's
gir1.2-gst-rtsp-server-1.0) serving a live moving ball as motion JPEG.

    /usr/bin/python3 tests/rtsp_server.py [SECONDS]

Run by Debian's Python, which has GObject introspection (the test venv does not). Prints
``serving rtsp://127.0.0.1:PORT/live`` once it listens on a free port, and exits after SECONDS
(default: never), dropping its clients: a camera that goes away.
"""

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# I420: what RTP's JPEG payload carries (rtpjpegpay refuses other samplings)
PIPELINE = ("( videotestsrc pattern=ball is-live=true ! video/x-raw,format=I420,width=96,"
            "height=80,framerate=15/1 ! jpegenc ! rtpjpegpay name=pay0 pt=26 )")


def main() -> None:
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service("0")  # a free port, said below
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(PIPELINE)
    factory.set_shared(True)
    server.get_mount_points().add_factory("/live", factory)
    server.attach(None)
    loop = GLib.MainLoop()
    if len(sys.argv) > 1:
        GLib.timeout_add(int(float(sys.argv[1]) * 1000), loop.quit)
    print(f"serving rtsp://127.0.0.1:{server.get_bound_port()}/live", flush=True)
    loop.run()


if __name__ == "__main__":
    main()
