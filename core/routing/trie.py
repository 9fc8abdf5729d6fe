"""A trie of wildcard patterns, for AMQP topic bindings and MQTT subscriptions alike.

Patterns and subjects arrive already split into words (AMQP) or levels (MQTT). A node has
literal children (a dict keyed by word), at most one single-word wildcard child (``*`` / ``+``)
and at most one multi-word wildcard child (``#``). A pattern ends at a node, which holds the
destinations bound through it and, for MQTT ``$share`` groups, the group members.

Matching a subject walks the trie with an explicit stack of ``(node, word index)`` states: at each
state it follows the literal child for the next word (one dict lookup), the single-word child,
and the multi-word child, which may swallow zero or more words. So the cost of a publish depends
on the subject's length and the wildcard branches that actually exist along its path, and not on
the number of bindings: 100,000 patterns ``dev.<i>.*.temp`` cost one dict lookup among 100,000
keys. A ``#`` with nothing after it (``a.#``, MQTT ``a/#``) is resolved at once without stepping
through the remaining words. A ``#`` followed by more words (``#.b``) is walked word by word,
remembering visited ``(#-node, index)`` states, so ``#.#.#`` patterns stay polynomial.

The multi-word wildcard follows RabbitMQ: it may appear anywhere and matches zero or more words,
so ``a.#`` matches ``a``. MQTT's ``#`` is the special case "only as the last level", which the
MQTT filter validation enforces before patterns reach the trie; the same walk then gives MQTT's
"``a/#`` matches ``a``". With ``dollar_rule`` (MQTT), a subject whose first word starts with
``$`` skips the root's wildcard children [MQTT-4.7.2-1].

Bindings are counted: adding the same (pattern, destination) twice needs two removals. Nodes
left empty by a removal are pruned. Not thread-safe: mutate and route from one thread (or
under one lock); the broker's event loop is that thread.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Final, Generic, TypeVar

D = TypeVar("D", bound=Hashable)  # a destination id
G = TypeVar("G", bound=Hashable)  # a shared-group key, e.g. an MQTT SharedSubscription

# Shared empty containers: a node with no children or destinations allocates nothing, and the
# walk needs no None checks. They are replaced by a fresh container before the first insert and
# never mutated.
_NO_CHILDREN: Final[dict[str, Any]] = {}
_NO_DESTINATIONS: Final[dict[Any, int]] = {}
_NO_GROUPS: Final[dict[Any, dict[Any, int]]] = {}

# How a node hangs from its parent, recorded on the way down so removal can prune upwards.
_LITERAL: Final = 0
_ONE: Final = 1
_MANY: Final = 2


class _Node(Generic[D, G]):
    __slots__ = ("children", "destinations", "groups", "many", "one", "swallows")

    def __init__(self, swallows: bool = False) -> None:
        self.children: dict[str, _Node[D, G]] = _NO_CHILDREN
        self.one: _Node[D, G] | None = None
        self.many: _Node[D, G] | None = None
        self.destinations: dict[D, int] = _NO_DESTINATIONS  # destination -> binding count
        self.groups: dict[G, dict[D, int]] = _NO_GROUPS  # group -> member -> binding count
        self.swallows = swallows  # a multi-word wildcard node: may consume further words

    def is_empty(self) -> bool:
        return (
            not self.children
            and self.one is None
            and self.many is None
            and not self.destinations
            and not self.groups
        )

    def is_tail(self) -> bool:
        """Nothing hangs below: a '#' node like this matches every remaining suffix."""
        return not self.children and self.one is None and self.many is None


class WildcardTrie(Generic[D, G]):
    """Wildcard patterns (word lists) mapped to destinations; see the module docstring.

    ``one`` and ``many`` are the single- and multi-word wildcard words (``"*"``, ``"#"`` for
    AMQP; ``"+"``, ``"#"`` for MQTT). ``dollar_rule`` turns on [MQTT-4.7.2-1].
    """

    __slots__ = ("_dollar_rule", "_entries", "_many", "_one", "_root")

    def __init__(self, one: str, many: str, *, dollar_rule: bool = False) -> None:
        self._one = one
        self._many = many
        self._dollar_rule = dollar_rule
        self._root: _Node[D, G] = _Node()
        self._entries = 0  # distinct (pattern, destination[, group]) pairs

    def __len__(self) -> int:
        """The number of distinct (pattern, destination) and (pattern, group, member) entries."""
        return self._entries

    def add(self, words: Sequence[str], destination: D, group: G | None = None) -> None:
        """Bind ``destination`` through the pattern ``words`` (as a member of ``group``)."""
        node = self._root
        for word in words:
            if word == self._one:
                child = node.one
                if child is None:
                    child = node.one = _Node()
            elif word == self._many:
                child = node.many
                if child is None:
                    child = node.many = _Node(swallows=True)
            else:
                if node.children is _NO_CHILDREN:
                    node.children = {}
                child = node.children.get(word)
                if child is None:
                    child = node.children[word] = _Node()
            node = child
        if group is None:
            if node.destinations is _NO_DESTINATIONS:
                node.destinations = {}
            counts = node.destinations
        else:
            if node.groups is _NO_GROUPS:
                node.groups = {}
            counts = node.groups.setdefault(group, {})
        if destination not in counts:
            self._entries += 1
        counts[destination] = counts.get(destination, 0) + 1

    def remove(self, words: Sequence[str], destination: D, group: G | None = None) -> bool:
        """Undo one :meth:`add`; ``False`` if there was no such binding. Prunes empty nodes."""
        path: list[tuple[_Node[D, G], int, str]] = []  # (parent, how the child hangs, word)
        node = self._root
        for word in words:
            if word == self._one:
                child, how = node.one, _ONE
            elif word == self._many:
                child, how = node.many, _MANY
            else:
                child, how = node.children.get(word), _LITERAL
            if child is None:
                return False
            path.append((node, how, word))
            node = child
        counts = node.destinations if group is None else node.groups.get(group, _NO_DESTINATIONS)
        count = counts.get(destination)
        if count is None:
            return False
        if count > 1:
            counts[destination] = count - 1
            return True
        del counts[destination]
        self._entries -= 1
        if group is not None and not counts:
            del node.groups[group]
        while path and node.is_empty():
            parent, how, word = path.pop()
            if how == _LITERAL:
                del parent.children[word]
            elif how == _ONE:
                parent.one = None
            else:
                parent.many = None
            node = parent
        return True

    def match(self, words: Sequence[str]) -> set[D]:
        """The destinations of every pattern matching ``words`` (shared groups left out)."""
        found: set[D] = set()
        self.collect(words, found)
        return found

    def collect(
        self,
        words: Sequence[str],
        found: set[D],
        groups: dict[G, set[D]] | None = None,
    ) -> None:
        """Add to ``found`` the destinations of every pattern matching ``words``.

        If ``groups`` is given, the members of each matching shared group are added to
        ``groups[group]``; otherwise shared groups are skipped. This is the publish hot path:
        literal children are followed in place, only wildcard branches go on the stack.
        """
        size = len(words)
        root = self._root
        # [MQTT-4.7.2-1]: '+' and '#' as the first level do not match a topic starting with '$'.
        guarded = root if self._dollar_rule and size and words[0][:1] == "$" else None
        stack: list[tuple[_Node[D, G], int]] = [(root, 0)]
        pop = stack.pop
        push = stack.append
        seen: set[tuple[_Node[D, G], int]] | None = None  # visited '#' states, made on demand
        while stack:
            node, index = pop()
            while True:
                many = node.many
                if many is not None and node is not guarded:
                    if many.is_tail():  # matches whatever remains (zero words too): resolve now
                        if many.destinations:
                            found.update(many.destinations)
                        if groups is not None and many.groups:
                            _add_groups(groups, many.groups)
                    else:
                        if seen is None:
                            seen = set()
                        if (many, index) not in seen:
                            seen.add((many, index))
                            push((many, index))  # '#' takes zero words
                if index == size:
                    if node.destinations:
                        found.update(node.destinations)
                    if groups is not None and node.groups:
                        _add_groups(groups, node.groups)
                    break
                if node.swallows:  # '#' takes this word too and stays
                    if seen is None:
                        seen = set()
                    state = (node, index + 1)
                    if state not in seen:
                        seen.add(state)
                        push(state)
                one = node.one
                if one is not None and node is not guarded:
                    push((one, index + 1))
                child = node.children.get(words[index])
                if child is None:
                    break
                node = child
                index += 1

    def node_count(self) -> int:
        """The number of nodes, root included (a measure of memory; 1 when empty)."""
        return sum(1 for _ in self._nodes())

    def _nodes(self) -> Iterator[_Node[D, G]]:
        pending = [self._root]
        while pending:
            node = pending.pop()
            yield node
            pending.extend(node.children.values())
            if node.one is not None:
                pending.append(node.one)
            if node.many is not None:
                pending.append(node.many)


def _add_groups(groups: dict[G, set[D]], members_by_group: dict[G, dict[D, int]]) -> None:
    for group, members in members_by_group.items():
        chosen = groups.get(group)
        if chosen is None:
            groups[group] = set(members)
        else:
            chosen.update(members)
