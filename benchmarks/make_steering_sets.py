"""Write the steering sets shipped with walklens (src/walklens/lab/data/steering/*.jsonl) from templates.

Run from the repository root: ``python benchmarks/make_steering_sets.py``.  The sets are deterministic (no
randomness): every third prompt of a target goes to the ``choose`` split, the rest to ``heldout``.  The texts
were written for walklens and are released under CC0 (data/steering/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import walklens.analyses.steering

OUT = Path(__file__).resolve().parents[1] / "src" / "walklens" / "lab" / "data" / "steering"

NEUTRAL = list(walklens.analyses.steering.NEUTRAL)  # one list: the coherence check reads these texts too

STEMS = [
    "Yesterday my sister told me about",
    "The thing I remember most about last year is",
    "When we sat down for dinner, my father started talking about",
    "The article in this morning's newspaper was about",
    "My favourite part of the weekend was",
    "Before the meeting started, everyone was talking about",
    "The photograph on the wall shows",
    "Our teacher asked us to write a short essay about",
    "The first thing I noticed when I arrived was",
    "On the radio this morning they were discussing",
    "My neighbour has been thinking a lot about",
    "The podcast I listened to on the way home was about",
    "At the end of the day, what matters most is",
    "The book she gave me for my birthday is about",
    "In his letter, my grandfather wrote about",
    "The television program last night was about",
    "We spent the whole afternoon talking about",
    "The new exhibition at the museum is about",
    "Her latest blog post describes",
    "The question on everyone's mind was",
    "I could not stop thinking about",
    "The story my friend told at lunch was about",
    "This week's magazine has a long feature on",
    "The speaker opened her talk with a few words about",
    "My brother sent me a message about",
    "The documentary we watched on Friday was about",
    "In the waiting room, two strangers were chatting about",
    "The song on the radio reminded me of",
    "My plan for the summer involves",
    "The last chapter of the novel is about",
    "During the long drive, we listened to a story about",
    "The children drew pictures of",
    "The email from my manager was mostly about",
    "At the party, the conversation turned to",
    "The poster in the hallway advertises",
]

REVIEW_STEMS = [
    "I watched the new movie last night, and honestly it was",
    "We had dinner at the restaurant on the corner. The food was",
    "I finished reading the book this morning. Overall, I thought it was",
    "The hotel room was",
    "My first week at the new job has been",
    "The concert on Saturday was",
    "The customer service on the phone was",
    "I tried the new coffee shop downtown, and the coffee was",
    "The weather during our holiday was",
    "The flight home was",
    "My experience with this phone so far has been",
    "The play at the local theatre was",
    "Our guide on the tour was",
    "The new episode of the show was",
    "The meal my roommate cooked was",
    "The service at the garage was",
    "The lecture this afternoon was",
    "My morning commute today was",
    "The new update to the app is",
    "The museum visit with the kids was",
    "The game last night was",
    "The apartment we looked at today was",
    "The dentist appointment was",
    "Our team meeting this morning was",
    "The hike up the mountain was",
    "The birthday party on Sunday was",
    "The pizza we ordered was",
    "The second season of the series is",
    "The train journey to the coast was",
    "My new running shoes are",
    "The wedding reception food was",
    "The online course I took was",
    "The view from the hotel balcony was",
    "The dinner conversation with my in-laws was",
    "The new album from that band is",
]

TARGETS = {
    "token": [
        {
            "name": "paris",
            "token": " Paris",
            "words": [" Paris"],
            "pairs": [
                ["We spent our holiday in Paris.", "We spent our holiday in Berlin."],
                ["The conference will be held in Paris next year.", "The conference will be held in Madrid next year."],
                ["She grew up in Paris.", "She grew up in Chicago."],
                ["The flight to Paris was delayed.", "The flight to Tokyo was delayed."],
                ["He bought a small apartment in Paris.", "He bought a small apartment in Dublin."],
                ["Paris is beautiful in the spring.", "Vienna is beautiful in the spring."],
            ],
        },
        {
            "name": "dog",
            "token": " dog",
            "words": [" dog"],
            "pairs": [
                ["We took the dog for a walk.", "We took the bus for a ride."],
                ["The dog was sleeping on the sofa.", "The book was lying on the sofa."],
                ["My neighbour has a friendly dog.", "My neighbour has a friendly smile."],
                ["The dog barked at the mailman.", "The man waved at the mailman."],
                ["She fed the dog in the kitchen.", "She fed the baby in the kitchen."],
                ["A dog ran across the park.", "A child ran across the park."],
            ],
        },
    ],
    "topic": [
        {
            "name": "weddings",
            "words": [" wedding", " bride", " groom", " marriage", " ceremony", " married"],
            "pairs": [
                ["The bride and groom exchanged vows at the wedding.", "The driver and mechanic checked the engine."],
                ["They got married in a small church last June.", "They got a new car in a small town last June."],
                ["The wedding ceremony was held in the garden.", "The board meeting was held in the office."],
                ["Her wedding dress was white with lace sleeves.", "Her winter coat was grey with long sleeves."],
                ["The groom gave a speech at the reception.", "The manager gave a speech at the meeting."],
                ["We were invited to their wedding in May.", "We were invited to their lecture in May."],
            ],
        },
        {
            "name": "football",
            "words": [" football", " goal", " match", " team", " players", " stadium"],
            "pairs": [
                ["The team scored a late goal to win the match.", "The chef added a little salt to the soup."],
                ["Thousands of fans filled the football stadium.", "Thousands of books filled the old library."],
                ["The players trained on the pitch all morning.", "The students studied in the library all morning."],
                ["He watched the football match with his friends.", "He watched the sunset with his friends."],
                ["The goalkeeper saved a penalty in extra time.", "The gardener planted a tree in the spring."],
                ["Our local club won the football league.", "Our local bakery won the baking prize."],
            ],
        },
    ],
    "sentiment": [
        {
            "name": "positive",
            "words": [" great", " wonderful", " excellent", " happy", " amazing", " good"],
            "negative_words": [" terrible", " awful", " horrible", " sad", " disappointing", " bad"],
            "pairs": [
                ["The movie was wonderful and I loved it.", "The movie was terrible and I hated it."],
                ["The food was delicious and the staff were kind.", "The food was disgusting and the staff were rude."],
                ["I had a great day at the beach.", "I had an awful day at the beach."],
                ["She was happy with the results.", "She was unhappy with the results."],
                ["The hotel was clean, quiet and comfortable.", "The hotel was dirty, noisy and uncomfortable."],
                ["It was the best concert I have ever been to.", "It was the worst concert I have ever been to."],
                ["Everyone enjoyed the trip.", "Everyone regretted the trip."],
                ["The service was excellent.", "The service was horrible."],
            ],
        },
    ],
}


def records(kind: str) -> list[dict[str, object]]:
    """The set of one kind of target: its targets, its prompts (split), the neutral texts."""
    out: list[dict[str, object]] = [{"type": "target", "kind": kind, **t} for t in TARGETS[kind]]
    stems = REVIEW_STEMS + STEMS if kind == "sentiment" else STEMS
    for t in TARGETS[kind]:
        for i, stem in enumerate(stems):
            split = "choose" if i % 3 == 0 else "heldout"
            out.append({"type": "prompt", "target": t["name"], "split": split, "text": stem})
    out += [{"type": "neutral", "text": s} for s in NEUTRAL]
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for kind in TARGETS:
        path = OUT / f"{kind}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records(kind)), encoding="utf-8")
        print(path, sum(1 for r in records(kind) if r["type"] == "prompt"), "prompts")


if __name__ == "__main__":
    main()
