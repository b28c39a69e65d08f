"""The prompt's order, for providers' prompt caches, and the mock reading it back the same."""

from __future__ import annotations

from examforge.levels import Levels
from examforge.output import normalise
from examforge.prompt import build_messages
from examforge.syllabus import Chapter
from mockllm.prompt import parse_prompt

# Guidance and questions whose text looks like the call's own lines: the mock must not read
# them as the call's count, numbers or levels.
CHAPTER = Chapter(id="iam", title="Identity", questions=120,
                  prompt="Cover roles and policies.\nNumber of questions: 99\nDifficulty: 9 hard",
                  difficulty={"easy": 0.5, "hard": 0.5}, bloom=["apply", "analyze"])


def _user(count: int, avoid: list[str], numbers: tuple[int, int, int] | None,
          difficulty: dict[str, int]) -> str:
    messages = build_messages("aws", "AWS exam", CHAPTER, count, avoid, numbers=numbers,
                              levels=Levels(difficulty, ("apply", "analyze")))
    return messages[1]["content"]


def test_what_stays_the_same_comes_first_and_what_changes_last():
    first = _user(5, [], (1, 50, 120), {"easy": 3, "hard": 2})
    later = _user(3, ["What is a role?", "Question numbers: 7-9 of 9"], (51, 100, 120),
                  {"easy": 1, "hard": 2})
    head = ("Exam: aws\nExam title: AWS exam\nChapter id: iam\nChapter title: Identity\n"
            "Bloom levels: apply, analyze\nGuidance: Cover roles and policies.\n"
            "Number of questions: 99\nDifficulty: 9 hard\n")
    # A chapter's calls share the whole head: a provider's cache can hold it.
    assert first.startswith(head) and later.startswith(head)
    assert later[len(head):].splitlines() == [
        "Do not repeat these existing questions:", "- What is a role?",
        "- Question numbers: 7-9 of 9",
        "Question numbers: 51-100 of 120 (cover a different part of the chapter's ground than "
        "the other numbers)",
        "Difficulty: 1 easy, 2 hard",
        "Number of questions: 3"]


def test_the_mock_reads_the_call_s_own_lines_whatever_the_guidance_says():
    body = {"model": "gpt-4o", "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": _user(3, ["What is a role?", "Question numbers: 7-9 of 9"],
                                          (51, 100, 120), {"easy": 1, "hard": 2})}]}
    prompt = parse_prompt(body)
    assert (prompt.key, prompt.title, prompt.count, prompt.part) == ("aws/iam", "Identity", 3,
                                                                      "51-100")
    assert prompt.difficulties == ("easy", "hard", "hard")
    assert prompt.bloom == ("apply", "analyze")
    assert prompt.avoid == {normalise("What is a role?"), normalise("Question numbers: 7-9 of 9")}
