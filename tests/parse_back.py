"""Read rendered files back the way their readers do: systemd a unit and an EnvironmentFile, rsync
its -e string, sshd's forced command's shell. A test renders a value, reads it back with these and
compares: a value that became syntax (a new line, word, key or option) shows as a difference.

Each reader is strict where the real one would expand: a specifier (%x), a variable ($X) or an
escape these do not know raises ValueError, so a value that reaches one is never taken as read.
"""

SYSTEMD_WHITESPACE = " \t\n\r"
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "s": " ", "\\": "\\", '"': '"', "'": "'"}

# The pins every rendering in the input tests starts from (the schema refuses none of them).
PINS = {"weights_model_revision": "a" * 40, "weights_draft_revision": "b" * 40,
        "image_base": "r/vllm@sha256:" + "c" * 64}



def unit_entries(text):
    """[(section, key, value)] of a unit file as systemd's conf-parser reads it: `#`/`;` lines
    skipped, a line ending in an unescaped backslash joined to the next with a space."""
    entries, section, pending = [], None, None
    for line in text.split("\n"):
        stripped = line.strip(SYSTEMD_WHITESPACE)
        if pending is None and (not stripped or stripped[0] in "#;"):
            continue
        if pending is not None and stripped[:1] in ("#", ";"):
            continue  # a comment inside a continuation is skipped too
        escaped = False
        for char in line:
            escaped = not escaped if char == "\\" else False
        if escaped:
            pending = (pending or "") + line[:-1] + " "
            continue
        whole = ((pending or "") + line).strip(SYSTEMD_WHITESPACE)
        pending = None
        if whole.startswith("[") and whole.endswith("]"):
            section = whole[1:-1]
            continue
        if "=" not in whole:
            raise ValueError(f"not an assignment: {whole!r}")
        key, value = whole.split("=", 1)
        entries.append((section, key.strip(SYSTEMD_WHITESPACE), value.strip(SYSTEMD_WHITESPACE)))
    if pending is not None:
        raise ValueError("the file ends in a continuation")
    return entries


def _cunescape(text, i):
    """(character, next index) of the C escape at text[i] (a backslash)."""
    if i + 1 >= len(text):
        raise ValueError("a backslash at the end")
    code = text[i + 1]
    if code in _C_ESCAPES:
        return _C_ESCAPES[code], i + 2
    if code == "x" and all(c in "0123456789abcdefABCDEF" for c in text[i + 2:i + 4]) and \
            len(text[i + 2:i + 4]) == 2:
        return chr(int(text[i + 2:i + 4], 16)), i + 4
    raise ValueError(f"an escape systemd reads otherwise: \\{code}")


def _unexpand(word):
    """A word after systemd's specifier and variable expansion, with only `%%` and `$$` allowed."""
    out, i = [], 0
    while i < len(word):
        char = word[i]
        if char in "%$":
            if word[i + 1:i + 2] != char:
                raise ValueError(f"systemd would expand {word[i:i + 2]!r} in {word!r}")
            out.append(char)
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def command_words(value):
    """The argv of an ExecStart=-style value (systemd.service(5) "Command lines"): words split on
    whitespace, quotes removed, C escapes decoded, %% and $$ undoubled; the prefixes (-@:+!) of the
    first word dropped."""
    words, i, n = [], 0, len(value)
    while True:
        while i < n and value[i] in SYSTEMD_WHITESPACE:
            i += 1
        if i >= n:
            break
        word, quote = [], None
        while i < n:
            char = value[i]
            if char == "\\":
                decoded, i = _cunescape(value, i)
                word.append(decoded)
            elif quote:
                if char == quote:
                    quote = None
                else:
                    word.append(char)
                i += 1
            elif char in SYSTEMD_WHITESPACE:
                break
            elif char in "\"'":
                quote = char
                i += 1
            else:
                word.append(char)
                i += 1
        if quote:
            raise ValueError(f"an unterminated quote in {value!r}")
        text = "".join(word)
        if text == ";":
            raise ValueError("a lone ; separates commands")
        words.append(_unexpand(text))
    if words:
        words[0] = words[0].lstrip("-@:+!")
    return words


def environment_file(text):
    """{name: value} of an EnvironmentFile as systemd reads an unquoted value, strictly: no quotes,
    no backslashes and no $ (systemd would unquote, unescape or substitute them)."""
    found = {}
    for line in text.split("\n"):
        if not line.strip() or line.lstrip()[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"no = in {line!r}")
        if any(c in value for c in "\"'\\$`") or value != value.strip(" \t\r"):
            raise ValueError(f"systemd would not read {value!r} as it is")
        found[name] = value
    return found


def rsync_words(command):
    """The words rsync makes of its -e string (rsync(1) --rsh; main.c do_cmd): split on spaces,
    single and double quotes keep spaces, a doubled quote inside quotes is one quote."""
    words, i, n = [], 0, len(command)
    while i < n:
        if command[i] == " ":
            i += 1
            continue
        word, quote = [], None
        while i < n and (command[i] != " " or quote):
            char = command[i]
            if char in "'\"":
                if not quote:
                    quote = char
                    i += 1
                    continue
                if char == quote:
                    if i + 1 < n and command[i + 1] == quote:
                        word.append(char)
                        i += 2
                        continue
                    quote = None
                    i += 1
                    continue
            word.append(char)
            i += 1
        if quote:
            raise ValueError(f"rsync: missing trailing-{quote} in {command!r}")
        words.append("".join(word))
    return words


def shell_words(command):
    """The words sh makes of a command line, strictly: quotes removed, and anything sh would
    expand, glob or treat as an operator (outside single quotes) raises ValueError."""
    words, word, i, n, started = [], [], 0, len(command), False
    while i < n:
        char = command[i]
        if char == "'":
            end = command.find("'", i + 1)
            if end < 0:
                raise ValueError(f"an unterminated quote in {command!r}")
            word.append(command[i + 1:end])
            started, i = True, end + 1
        elif char == '"':
            end = command.find('"', i + 1)
            inside = command[i + 1:end]
            if end < 0 or any(c in inside for c in "$`\\"):
                raise ValueError(f"sh would read {command[i:]!r} otherwise")
            word.append(inside)
            started, i = True, end + 1
        elif char in " \t\n":
            if started:
                words.append("".join(word))
            word, started, i = [], False, i + 1
        elif char in "\\$`*?[;&|<>()~#{}!" or ord(char) < 32:
            raise ValueError(f"sh would read {char!r} in {command!r} otherwise")
        else:
            word.append(char)
            started, i = True, i + 1
    if started:
        words.append("".join(word))
    return words
