"""Red team, resource exhaustion: CPU, wall time, processes, threads, memory, disk, inodes,
/tmp, /dev/shm, output volume and the outcome channel. Each must end within its limit, score
0 and leave the host untouched (the folder's conftest checks the grader's temp root)."""

import pytest

from tests.codetasks.sandbox.redteam.attacks import RED, grade, impl, patch

ATTACKS = {
  "infinite_loop": "while True:\n  pass",
  "sleep_forever": "import time\ntime.sleep(10**6)",
  "fork_bomb": "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass",
  "thread_bomb": (
    "import threading, time\nwhile True:\n"
    "  threading.Thread(target=time.sleep, args=(100,), daemon=True).start()"
  ),
  "alloc_10gb": "blob = bytearray(10 << 30)\nreturn float(len(blob))",
  "disk_fill_workspace_and_tmp": (
    "chunk = b'x' * (1 << 20)\n"
    "for path in ('/ws/big', '/tmp/big', '/dev/shm/big', '/big', '/cj/big', '/root/big'):\n"
    "  try:\n    with open(path, 'wb') as f:\n      for _ in range(4096):\n"
    "        f.write(chunk)\n  except OSError:\n    pass\nreturn 0.0"
  ),
  "inode_fill": (
    "import os\nfor d in ('/tmp', '/ws', '/dev/shm'):\n  try:\n"
    "    for i in range(10**6):\n      open(f'{d}/f{i}', 'w').close()\n"
    "  except OSError:\n    pass\nreturn 0.0"
  ),
  "output_flood": "import os\nline = b'y' * 65536\nwhile True:\n  os.write(1, line)\n  os.write(2, line)",
  "channel_flood": (
    "import os\nline = b'z' * 65536\nwhile True:\n  for fd in range(3, 16):\n"
    "    try:\n      os.write(fd, line)\n    except OSError:\n      pass"
  ),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_exhaustion(hypot_task, name):
  g = grade(hypot_task, patch(hypot_task, impl(ATTACKS[name])))
  assert g.wall_s < RED.wall_s + 5, g.wall_s
