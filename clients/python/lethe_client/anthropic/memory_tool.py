"""`LetheMemoryTool`: Claude's memory tool (`memory_20250818`, run client-side by the anthropic SDK) over Lethe memory.

One Lethe namespace holds the tool's /memories tree, one key per file (paths.py), the file's text as the value.
Every edit is a conditional write on the version this call read, so two agents editing one file never lose an
update silently: the later one gets a ToolError telling the model to view the file again. `delete` and `rename`
forget the old content (a Lethe tombstone: the value is erased from the key and its history, and the forget
cascades into every session that was shown it), they never overwrite it.

Results and errors follow the SDK's own local-filesystem tool (`BetaLocalFilesystemMemoryTool`), word for word
where it has them, so a model sees the same tool whichever backend runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from anthropic.lib.tools import ToolError
from anthropic.tools import BetaAbstractMemoryTool
from anthropic.types.beta import (
    BetaCacheControlEphemeralParam,
    BetaMemoryTool20250818CreateCommand,
    BetaMemoryTool20250818DeleteCommand,
    BetaMemoryTool20250818InsertCommand,
    BetaMemoryTool20250818RenameCommand,
    BetaMemoryTool20250818StrReplaceCommand,
    BetaMemoryTool20250818ViewCommand,
)

from lethe_client.anthropic import paths
from lethe_client.errors import Forgotten, NotFound, PreconditionFailed
from lethe_client.sync import LetheClient

LINE_NUMBER_WIDTH = 6  # the SDK's: len(str(999999))


@dataclass(frozen=True)
class File:
    rel: str
    text: str
    version: int


class LetheMemoryTool(BetaAbstractMemoryTool):
    """Pass it to `client.beta.messages.tool_runner(tools=[LetheMemoryTool(lethe, "user-42-memories")], ...)`.

    `namespace` is the Lethe memory namespace holding this tool's /memories tree (one per agent, user or project,
    as you scope memory); `source` is recorded on every version the tool writes or forgets."""

    def __init__(
        self,
        lethe: LetheClient,
        namespace: str = "claude-memories",
        *,
        source: str = "agent",
        cache_control: BetaCacheControlEphemeralParam | None = None,
    ) -> None:
        super().__init__(cache_control=cache_control)
        self.lethe = lethe
        self.namespace = namespace
        self.source = source

    # ---- the store -------------------------------------------------------------------------------------------

    def _keys(self) -> list[str]:
        """Every file path in the tree, decoded."""
        found: list[str] = []
        cursor: str | None = None
        while True:
            page = self.lethe.list(self.namespace, limit=100, cursor=cursor)
            found.extend(paths.from_key(k) for k in page.keys)
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    def _read(self, rel: str) -> File | None:
        try:
            record = self.lethe.get(self.namespace, paths.key(rel))
        except NotFound:
            return None
        return File(rel, _text(record.value), record.version)

    def _absent_version(self, rel: str) -> int | None:
        """None if the file exists; else the version a create must name (0: never written, or its tombstone's)."""
        try:
            self.lethe.get(self.namespace, paths.key(rel))
        except Forgotten as gone:
            return gone.version
        except NotFound:
            return 0
        return None

    def _is_dir(self, rel: str, keys: list[str]) -> bool:
        return rel == "" or any(paths.under(k, rel) for k in keys)

    def _write(self, file: File, text: str, path: str) -> None:
        """Replace `file`'s text, on condition that it still has the version read."""
        try:
            self.lethe.put(self.namespace, paths.key(file.rel), text, if_match=file.version, source=self.source)
        except PreconditionFailed as stale:
            raise _changed(path, stale) from stale

    def _create(self, rel: str, text: str, path: str) -> None:
        """Write a new file; ToolError if it exists, a directory is there, or a parent is a file."""
        keys = self._keys()
        if self._is_dir(rel, keys):
            raise ToolError(f"The path {path} is a directory")
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in keys:
                raise ToolError(f"The path {paths.display(parent)} is a file, not a directory")
        base = self._absent_version(rel)
        if base is None:
            raise ToolError(f"File {path} already exists")
        try:
            # A key forgotten before is re-established on its tombstone version: the writer proves it saw the forget.
            if base == 0:
                self.lethe.put(self.namespace, paths.key(rel), text, if_none_match=True, source=self.source)
            else:
                self.lethe.put(self.namespace, paths.key(rel), text, if_match=base, source=self.source)
        except PreconditionFailed as raced:
            if raced.forgotten:
                raise _changed(path, raced) from raced
            raise ToolError(f"File {path} already exists") from raced

    def _file(self, path: str) -> File:
        rel = paths.relative(path)
        file = self._read(rel) if rel else None
        if file is not None:
            return file
        if self._is_dir(rel, self._keys()):
            raise ToolError(f"The path {path} is not a file.")
        raise ToolError(f"The path {path} does not exist. Please provide a valid path.")

    # ---- the commands ----------------------------------------------------------------------------------------

    def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        rel = paths.relative(command.path)
        file = self._read(rel) if rel else None
        if file is not None:
            return _numbered(command.path, file.text, command.view_range)
        keys = self._keys()
        if not self._is_dir(rel, keys):
            raise ToolError(f"The path {command.path} does not exist. Please provide a valid path.")
        return self._listing(rel, [k for k in keys if paths.under(k, rel)])

    def _listing(self, rel: str, below: list[str]) -> str:
        """The SDK's listing: entries up to 2 levels deep, name order, hidden ones left out. A directory's size is
        the sum of its files' (no directory is stored, so there is no block size to show)."""
        sizes: dict[str, int] = {}
        for k in below:
            file = self._read(k)
            if file is not None:  # forgotten since the listing: gone
                sizes[k] = len(file.text.encode("utf-8"))
        start = len(rel) + 1 if rel else 0
        entries: dict[tuple[str, ...], int] = {}
        dirs: set[tuple[str, ...]] = set()
        for k, size in sizes.items():
            parts = tuple(k[start:].split("/"))
            for depth in range(1, min(len(parts), 2) + 1):
                entry = parts[:depth]
                if any(p.startswith(".") for p in entry):
                    break
                entries[entry] = entries.get(entry, 0) + size
                if depth < len(parts):
                    dirs.add(entry)
        shown = paths.display(rel)
        lines = [f"{_size(sum(sizes.values()))}\t{shown}"]
        for entry in sorted(entries):
            name = "/".join(entry) + ("/" if entry in dirs else "")
            lines.append(f"{_size(entries[entry])}\t{shown}/{name}")
        header = f"Here're the files and directories up to 2 levels deep in {shown}, excluding hidden items:"
        return header + "\n" + "\n".join(lines)

    def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        rel = paths.relative(command.path)
        if not rel:
            raise ToolError(f"The path {command.path} is a directory")
        self._create(rel, command.file_text, command.path)
        return f"File created successfully at: {command.path}"

    def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        file = self._file(command.path)
        content, old = file.text, command.old_str
        count = content.count(old) if old else 0
        if count == 0:
            raise ToolError(
                f"No replacement was performed, old_str `{old}` did not appear verbatim in {command.path}."
            )
        if count > 1:
            lines, start = [], 0
            while (pos := content.find(old, start)) != -1:
                lines.append(content[:pos].count("\n") + 1)
                start = pos + 1
            raise ToolError(
                f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines: "
                f"{', '.join(map(str, lines))}. Please ensure it is unique"
            )
        changed = content[: content.find(old)].count("\n")
        new_content = content.replace(old, command.new_str)
        self._write(file, new_content, command.path)
        new_lines = new_content.split("\n")
        snippet = [
            f"{str(n).rjust(LINE_NUMBER_WIDTH)}\t{new_lines[n - 1]}"
            for n in range(max(0, changed - 2) + 1, min(len(new_lines), changed + 3) + 1)
        ]
        return (
            "The memory file has been edited. Here is the snippet showing the change (with line numbers):\n"
            + "\n".join(snippet)
        )

    def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        file = self._file(command.path)
        lines = file.text.split("\n")
        if lines[-1] == "":  # the SDK's line split: no empty line after a trailing newline
            lines.pop()
        if command.insert_line < 0 or command.insert_line > len(lines):
            raise ToolError(
                f"Invalid `insert_line` parameter: {command.insert_line}. "
                f"It should be within the range [0, {len(lines)}]."
            )
        lines.insert(command.insert_line, command.insert_text.rstrip("\n"))
        self._write(file, "\n".join(lines) + "\n", command.path)
        return f"The file {command.path} has been edited."

    def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        rel = paths.relative(command.path)
        if not rel:
            raise ToolError("Cannot delete the /memories directory itself")
        doomed = self._files_at(rel)
        if not doomed:
            raise ToolError(f"The path {command.path} does not exist")
        for k in doomed:
            self.lethe.forget(self.namespace, paths.key(k), source=self.source)
        return f"Successfully deleted {command.path}"

    def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        old_rel, new_rel = paths.relative(command.old_path), paths.relative(command.new_path)
        if not old_rel:
            raise ToolError("Cannot rename the /memories directory itself")
        if not new_rel:
            raise ToolError(f"The destination {command.new_path} already exists")
        if paths.under(new_rel, old_rel):
            raise ToolError(f"Cannot move {command.old_path} into itself ({command.new_path})")
        moving = self._files_at(old_rel)
        if not moving:
            raise ToolError(f"The path {command.old_path} does not exist")
        if self._files_at(new_rel):
            raise ToolError(f"The destination {command.new_path} already exists")
        lost: list[str] = []
        for k in moving:
            file = self._read(k)
            if file is None:  # deleted since the listing: nothing to move
                continue
            target = new_rel + k[len(old_rel) :]
            self._create(target, file.text, paths.display(target))
            # Copy first, forget after: a failure between the two leaves both, never neither. There is no
            # conditional forget, so an edit landing between the read and the forget is forgotten with the old
            # path; the tombstone's version shows it (the next one after the version read), and it is reported.
            tombstone = self.lethe.forget(self.namespace, paths.key(k), source=self.source)
            if tombstone.version != file.version + 1:
                lost.append(paths.display(k))
        if lost:
            raise ToolError(
                f"Renamed {command.old_path} to {command.new_path}, but {', '.join(lost)} changed while it was "
                "renamed: the new path holds the content read before that change, which was forgotten with the "
                "old path"
            )
        return f"Successfully renamed {command.old_path} to {command.new_path}"

    def clear_all_memory(self) -> str:
        for k in self._keys():
            self.lethe.forget(self.namespace, paths.key(k), source=self.source)
        return "All memory cleared"

    def _files_at(self, rel: str) -> list[str]:
        """The file `rel`, or every file below the directory `rel`; [] if neither exists."""
        keys = self._keys()
        return sorted(k for k in keys if k == rel or paths.under(k, rel))


def _text(value: object) -> str:
    # The tool writes strings; a value someone else wrote in this namespace is shown as its JSON-ish text.
    return value if isinstance(value, str) else str(value)


def _changed(path: str, stale: PreconditionFailed) -> ToolError:
    if stale.forgotten:
        return ToolError(f"The file {path} no longer exists (may have been deleted or renamed concurrently).")
    return ToolError(
        f"The file {path} was changed by another writer after it was read (now version "
        f"{stale.current_version}); nothing was written. View it again and retry the edit."
    )


def _numbered(path: str, content: str, view_range: list[int] | None) -> str:
    lines = content.split("\n")
    start, end = 1, len(lines)
    if view_range is not None:
        if len(view_range) != 2:
            raise ToolError(f"Invalid `view_range` parameter: {view_range}. It should be a list of two integers.")
        start, end = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
        if not 1 <= start <= len(lines):
            raise ToolError(
                f"Invalid `view_range` parameter: {view_range}. Its first element `{start}` should be within the "
                f"range of lines of the file: [1, {len(lines)}]."
            )
        if not start <= end <= len(lines):
            raise ToolError(
                f"Invalid `view_range` parameter: {view_range}. Its second element `{view_range[1]}` should be -1 "
                f"or within [{start}, {len(lines)}]."
            )
    numbered = [f"{str(n).rjust(LINE_NUMBER_WIDTH)}\t{lines[n - 1]}" for n in range(start, end + 1)]
    return f"Here's the content of {path} with line numbers:\n" + "\n".join(numbered)


def _size(n: int) -> str:
    """The SDK's human-readable size."""
    if n == 0:
        return "0B"
    i = min((n.bit_length() - 1) // 10, 3)
    scaled = n / (1024**i)
    unit = "BKMG"[i]
    return f"{int(scaled)}{unit}" if scaled == int(scaled) else f"{scaled:.1f}{unit}"
