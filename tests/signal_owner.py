"""Who handles SIGSEGV in a process: the shared object that holds the handler, read with
sigaction(2) and dladdr(3). HotSpot takes SIGSEGV for its own use (safepoint polls, implicit
null checks); if anything puts the default handler back, or another handler in front, the JVM's
next one kills the process. `SIGSEGV_OWNER` is source for a test's subprocess (or actor): it
defines `sigsegv_owner()`, which names that shared object ("default" when none)."""

SIGSEGV_OWNER = """
import ctypes, signal

class _Sigaction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]

class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

def sigsegv_owner():
    libc = ctypes.CDLL(None)
    current = _Sigaction()
    libc.sigaction(signal.SIGSEGV, None, ctypes.byref(current))
    info = _DlInfo()
    if current.handler and current.handler > 1 and libc.dladdr(
        ctypes.c_void_p(current.handler), ctypes.byref(info)
    ):
        return info.fname.decode().rsplit("/", 1)[-1]
    return "default"
"""
