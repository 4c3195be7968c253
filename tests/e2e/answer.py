"""Runs a command on a terminal of its own and answers its questions, as a user at a terminal
would: `answer.py PROMPT ANSWER [PROMPT ANSWER ...] -- COMMAND ARGS...`. Each ANSWER is typed
(with Enter, except a lone control key such as Ctrl-C) once its PROMPT has appeared in the output after the previous one's. Prints what
the terminal showed and exits with the command's status; 124 when a prompt never came."""
import os
import pty
import select
import sys
import time

sep = sys.argv.index("--")
pairs = sys.argv[1:sep]
argv = sys.argv[sep + 1:]
expect = list(zip(pairs[0::2], pairs[1::2]))

pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)

seen = b""
pos = 0
deadline = time.time() + 200
while True:
    if expect:
        prompt, answer = expect[0]
        at = seen.find(prompt.encode(), pos)
        if at >= 0:
            pos = at + len(prompt)
            # A control key (Ctrl-C) is typed alone, as a user does; a word with Enter. (Enter
            # after Ctrl-C raced the signal: the read got an empty line and the program went on.)
            os.write(fd, answer.encode() if len(answer) == 1 and ord(answer) < 32 else answer.encode() + b"\r")
            expect.pop(0)
            continue
    if time.time() > deadline:
        break
    ready, _, _ = select.select([fd], [], [], 1.0)
    if not ready:
        continue
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    seen += chunk

_, status = os.waitpid(pid, 0)
sys.stdout.write(seen.decode("utf-8", "replace"))
if expect:
    sys.stdout.write("\nanswer.py: never asked: %r\n" % (expect[0][0],))
    sys.exit(124)
sys.exit(os.waitstatus_to_exitcode(status))
