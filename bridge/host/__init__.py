"""What the bridge asks of the host's kernel for itself: the mount table and mount points
(mountinfo.py), and the process's garbage collector around bulk work (heap.py)."""
