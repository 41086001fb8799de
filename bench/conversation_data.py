"""Long two-person chats with labelled questions, made up deterministically (stdlib only).

:func:`generate` returns conversations of 16 to 22 dated sessions of 15 to 40 turns each:
mostly small talk (greetings, reactions, questions back, chatter that names pets, cities,
jobs and hobbies that are nobody's own), and now and then a turn stating a fact about its
speaker, some of which change (a new job, a move). Each question lists the ids of the turns
that answer it (its evidence). The evidence says what the question asks in other words
("Another double shift on the ward" for "What did Ana do for a living?"), so finding it
takes understanding, not the question's own words; a few questions share a key noun.

Kinds: ``single-hop`` (one fact), ``multi-hop`` (2-3 turns of different sessions),
``temporal`` (the answer is the date of the session of the turn stating it) and
``open-domain`` (an inference from turns about the speaker). The same seed gives the same
data byte for byte.

:func:`written` loads the other set, ``bench/data/chats/``: 10 chats written in full as
friends write (about 4,100 turns, 624 questions of the same kinds, each with the turns that
answer it). There the questions are worded as an annotator words them, sharing words with
their evidence where that comes naturally, replies often carry the fact while the turn
before names the topic ("did you end up going?" / "yes! made a wonky bowl"), and "when"
questions are answered by the session's date and what the turn says ("yesterday", "on
Friday"). The two sets pull apart: the made-up one rewards meaning, the written one
keywords and context, so a ranking is chosen on both.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("single-hop", "multi-hop", "temporal", "open-domain")
_MONTHS = "January February March April May June July August September October November December"
MONTHS = _MONTHS.split()
NAMES = [
    "Maria",
    "Jonas",
    "Priya",
    "Tom",
    "Aiko",
    "Liam",
    "Sofia",
    "Omar",
    "Hannah",
    "Diego",
    "Chloe",
    "Ravi",
    "Elena",
    "Sam",
    "Nadia",
    "Felix",
    "Grace",
    "Mateo",
    "Zoe",
    "Ben",
    "Yara",
    "Leo",
    "Ines",
    "Kofi",
]


@dataclass(frozen=True)
class Turn:
    id: str
    date: str  # the session's, as "8 May 2023"
    speaker: str
    text: str

    @property
    def content(self) -> str:
        return f"{self.date} {self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    id: str
    kind: str  # one of KINDS
    text: str
    answer: str
    evidence: tuple[str, ...]  # Turn ids


@dataclass
class Conversation:
    id: str
    speakers: tuple[str, str]
    sessions: list[list[Turn]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s]


# fmt: off
# (species, breed, young one)
PETS = [("dog", "beagle", "puppy"), ("dog", "golden retriever", "puppy"),
        ("dog", "dachshund", "puppy"), ("cat", "tabby", "kitten"), ("cat", "Maine Coon", "kitten"),
        ("cat", "ginger", "kitten"), ("rabbit", "lop-eared", "bunny")]
PET_NAMES = ["Biscuit", "Pepper", "Mochi", "Luna", "Ziggy", "Olive", "Waffles", "Pickle",
             "Nala", "Bruno", "Noodle", "Fig"]
PET_SAYS = [
    "Guess what, we finally adopted a little {breed} {young}! {pet} has already chewed a slipper.",
    "Meet {pet}, the newest member of the household: a {breed} {young} from the shelter.",
    "So I may have come home from the rescue centre with a {breed} {young}... meet {pet}.",
    "Couldn't sleep, {pet} cried all night. A {breed} {young} is basically a newborn.",
]
# (title, what a day at that work sounds like, what one could ask such a person for)
JOBS = [
    ("nurse", ["Another double shift on the ward, my feet are killing me.",
               "Three patients discharged and one very grumpy surgeon, standard Tuesday."],
     "a nasty cut"),
    ("primary school teacher", ["Spent the whole evening marking thirty spelling tests.",
                                "My class made volcanoes today, the classroom is a disaster."],
     "a child who struggles to read"),
    ("software developer", ["Spent all day chasing one bug in our checkout code.",
                            "Our release slipped again because the build server died."],
     "a broken website"),
    ("accountant", ["Quarter end at the firm, I basically live inside spreadsheets now.",
                    "Reconciled ledgers until 9pm, please send snacks."], "a tax return"),
    ("chef", ["Dinner rush was insane tonight, we did two hundred covers.",
              "Burned my wrist on the grill again, occupational hazard."],
     "a dinner party menu"),
    ("architect", ["The client rejected our floor plans for the third time.",
                   "Spent the day on site checking the foundations of the new library."],
     "a house extension"),
    ("electrician", ["Rewired an entire kitchen today, crawled under floors for hours.",
                     "Found a fuse box from 1962 at a customer's house, terrifying."],
     "lights that keep flickering"),
    ("journalist", ["My editor wants the story filed by midnight, so that's my evening gone.",
                    "Interviewed the mayor this morning, she dodged every question."],
     "a press release"),
]
JOB_CHANGE = [
    "Big news: I handed in my notice! Starting next month as {new}.",
    "Signed the contract today, from the first of the month I'm working as {new}. Scary!",
    "I took the leap and quit. Monday is my first day as {new}.",
]
CITIES = ["Leeds", "Porto", "Denver", "Lyon", "Melbourne", "Toronto", "Glasgow", "Austin",
          "Seville", "Utrecht", "Krakow"]
OLD_CITY = [
    "It's been raining nonstop here in {city} for a week.",
    "Walked along the river in {city} this morning, still love this place.",
    "Rent in {city} went up again, unbelievable.",
]
MOVE = [
    "The movers come Friday, then it's goodbye old flat and hello {city}!",
    "We did it, we actually relocated to {city}. Boxes everywhere.",
    "First night in the new place in {city}, the neighbours seem lovely.",
]
NEW_CITY = ["Found the best bakery two streets away here in {city}.",
            "Still getting lost on the buses here in {city}, ha."]
# (city, country, what was best)
TRIPS = [("Lisbon", "Portugal", "the trams and the custard tarts"),
         ("Kyoto", "Japan", "the bamboo forest at dawn"),
         ("Reykjavik", "Iceland", "the geysers and the black sand beach"),
         ("Marrakesh", "Morocco", "getting lost in the souks"),
         ("Cusco", "Peru", "the trek up to Machu Picchu"),
         ("Edinburgh", "Scotland", "the castle in the fog"),
         ("Hanoi", "Vietnam", "the street food on every corner"),
         ("Cape Town", "South Africa", "the cable car up Table Mountain"),
         ("Prague", "the Czech Republic", "the old bridge at sunrise"),
         ("Vancouver", "Canada", "cycling the seawall")]
TRIP_CITY = ["Just got back from {city}! Honestly, {best} was unreal.",
             "Greetings from {city} :) {Best} alone was worth the flight."]
TRIP_COUNTRY = [
    "Sorry for the radio silence, I was in {country} all week. {Best}, need I say more?",
                "Home from {country} and already missing {best}."]
OUTDOOR = [
    ("hiking", ["Spent Sunday scrambling up a ridge with the walking group, my legs are jelly.",
                "Did a 20 km trail over the moors, saw three deer!"]),
    ("rock climbing", ["Finally got up that overhang route at the crag!",
                       "My forearms are wrecked after bouldering all afternoon."]),
    ("kayaking", ["Paddled twelve kilometres down the river with the club, so peaceful.",
                  "Capsized twice today but the rapids were worth it."]),
    ("trail running", ["Muddy 15k through the woods this morning, best start to a Saturday.",
                       "New personal best on the forest loop, lungs on fire."]),
    ("camping", ["Slept in a tent by the lake, woke up to frost on the canvas.",
                 "Three nights up in the mountains with no signal, bliss."]),
]
INDOOR = [
    ("knitting", ["Finished the sleeves of my cardigan, only the collar left.",
                  "Bought way too much merino yarn at the craft fair."]),
    ("video games", ["Stayed up till 2am trying to beat the final boss.",
                     "Our online squad finally won a ranked match!"]),
    ("baking", ["My sourdough starter survived the week and the loaf actually rose!",
                "Made a three-layer lemon sponge for no reason at all."]),
    ("chess", ["Won my first tournament game at the club tonight.",
               "Been studying endgames every evening, my brain hurts."]),
    ("painting", ["Spent the afternoon on a watercolour of the harbour.",
                  "My oil portrait of the kitchen window is nearly done."]),
]
# (thing, question, what was said)
BUYS = [
    ("a second-hand Mazda", "What vehicle did {s} buy?",
     "Drove my 'new' used Mazda home today, only 40k on the clock!"),
    ("a road bike", "What did {s} buy to get around on two wheels?",
     "Treated myself to a carbon racer with drop handlebars, it weighs nothing."),
    ("an espresso machine", "What kitchen appliance did {s} buy?",
     "The coffee maker with the steam wand arrived, I've had four flat whites already."),
    ("an upright piano", "What musical instrument did {s} buy?",
     "A secondhand upright with 88 keys now lives in our living room, sorry neighbours."),
    ("a drone", "What gadget did {s} buy?",
     "Took my new quadcopter up over the park, the aerial footage is amazing."),
]
# (ailment, what was said)
ILLS = [("a sprained ankle", "Rolled my ankle on the stairs, it's the size of a grapefruit."),
        ("a broken wrist", "Cast on my arm for six weeks, typing this one-handed."),
        ("a bad back", "My lower back went when I lifted a box, I can barely sit."),
        ("the flu", "Fever of 39 and everything aches, been in bed for two days."),
        ("knee surgery", "The surgeon says the operation went well, crutches for a month.")]
# (plan, question, what was said)
PLANS = [("a wedding", "What big event is {s} planning?", "We set a date! We're tying the knot."),
         ("a marathon", "What race is {s} training for?",
          "Signed up for 26.2 miles in the spring, training starts now."),
         ("buying a house", "What is {s} trying to buy?",
          "We put an offer in on a little terraced place with a garden!"),
         ("learning Spanish", "What is {s} studying in the evenings?",
          "Enrolled in evening classes, hola and gracias so far.")]
KIDS = [
    ("boy", "nephew", ["Leo", "Max", "Arlo", "Theo"]),
    ("girl", "niece", ["Mia", "Ivy", "Rosa", "Ada"]),
]
SIBS = [("sister", ["Ana", "Beth", "Carla", "Dora"]), ("brother", ["Eli", "Finn", "Hugo", "Ivan"])]

SHOWS = ["that Danish crime series", "the baking show", "a documentary about octopuses"]
DISHES = ["a big pot of chilli", "homemade dumplings", "a very sad omelette", "mushroom risotto"]
WEATHER = ["grey", "humid", "windy", "freezing", "weirdly warm"]
SMALL = [
    "I've been binge-watching {show}, no regrets.", "Made {dish} for dinner, turned out okay.",
    "It's so {weather} today, I don't want to leave the house.", "Can't believe it's {month}.",
    "The traffic this morning was a nightmare.", "Trying to drink less coffee. It's going badly.",
    "My neighbour's {breed} barks every time I open the door.",
    "A friend of mine just moved to {city}, she says it's lovely.",
    "Saw a documentary about {country} last night, looks stunning.",
    "I keep saying I'll take up {hobby} one day.",
    "My cousin works as {job}, says it's exhausting.",
    "Did you catch the match on Saturday?", "Slept eleven hours last night, felt amazing.",
    "I need a holiday so badly.", "We had a power cut for three hours yesterday.",
    "Work's been fine, nothing exciting.", "My phone screen cracked again, of course.",
    "Tried that new ramen place, pretty good.", "The gym was packed tonight.",
    "Thinking of repainting the bedroom, maybe green?", "Our washing machine died, fun times.",
]
REACT = ["Haha no way!", "That's amazing!!", "Oh no, I'm so sorry.", "Wow, good for you!",
         "lol same", "Honestly that sounds exhausting.", "I love that for you.", "Wait, really?",
         "Ha, classic.", "Ooh, tell me more.", "Send pics!!", "That's so exciting.",
         "Ugh, that's the worst.", "Fair enough.", "Totally get that.", "Aww.", "Good luck!"]
ASK = ["How about you?", "What have you been up to?", "Any plans for the weekend?",
       "How did that go in the end?", "How's everyone at home?", "What's new with you?",
       "Did you ever sort that thing out?", "How are you feeling?"]
ANSWER = ["Nothing much, just work and sleep.", "Same old, same old.", "Not a lot, quiet week.",
          "Mostly just relaxing, to be honest.", "Busy! But the good kind."]
GREET = ["Hey {o}! How's your week going?", "Hi {o}, long time no chat!", "Morning! Got a sec?",
         "Heyyy {o}, how are things?", "{o}! Been meaning to message you."]
GREET_BACK = ["Hey! Pretty good, busy as always. You?", "Hi hi! Not bad at all, you?",
              "Oh hey, so good to hear from you!", "All good here, just tired. What's up?"]
CLOSE = ["Gotta run, talk soon!", "Okay, off to bed. Night!", "Catch you later!", "Speak soon x",
         "Right, back to work. Bye!"]
# fmt: on


def _date(day: dt.date) -> str:
    return f"{day.day} {MONTHS[day.month - 1]} {day.year}"


@dataclass
class _Facts:
    """A speaker's facts: ``says`` maps a fact key to (session, text), filled by the plan;
    ``ask`` lists (kind, question, answer, evidence keys)."""

    says: dict[str, tuple[int, str]] = field(default_factory=dict)
    ask: list[tuple[str, str, str, tuple[str, ...]]] = field(default_factory=list)


def _person(rng: random.Random, s: str, sessions: int, avoid: dict[str, object]) -> _Facts:
    """One speaker's facts, their sessions and the questions about them (``avoid`` holds
    the other speaker's picks, so that the two do not share a city or a trip)."""
    # fmt: off
    f = _Facts()
    say, ask = f.says, f.ask
    n = sessions
    change = rng.randrange(n * 2 // 5, n // 2)
    move = rng.randrange(change + 1, n * 3 // 4)
    spare = [x for x in range(n) if x not in (change, move)]
    species, breed, young = rng.choice(PETS)
    pet = rng.choice(PET_NAMES)
    say["pet"] = (rng.choice(spare), rng.choice(PET_SAYS).format(breed=breed, young=young, pet=pet))
    old, new = rng.sample(JOBS, 2)
    for i, text in enumerate(old[1]):
        say[f"oldjob{i}"] = (rng.randrange(i * change // 2, (i + 1) * change // 2), text)
    say["change"] = (change, rng.choice(JOB_CHANGE).format(new=_a(new[0])))
    say["newjob"] = (rng.randrange(change + 1, n), rng.choice(new[1]))
    cities = [c for c in CITIES if c not in avoid.get("cities", ())]  # type: ignore[operator]
    here, there = rng.sample(cities, 2)
    avoid["cities"] = (here, there)
    # Not in a session of the old job's turns: a multi-hop question needs both.
    early = [x for x in range(change) if x not in (say["oldjob0"][0], say["oldjob1"][0])]
    say["oldcity"] = (rng.choice(early), rng.choice(OLD_CITY).format(city=here))
    say["move"] = (move, rng.choice(MOVE).format(city=there))
    say["newcity"] = (rng.randrange(move + 1, n), rng.choice(NEW_CITY).format(city=there))
    trips = rng.sample([t for t in TRIPS if t not in avoid.get("trips", ())], 3)  # type: ignore[operator]
    avoid["trips"] = trips
    for i, ((city, country, best), at) in enumerate(zip(trips, rng.sample(spare, 3), strict=True)):
        by_city = rng.random() < 0.5
        text = rng.choice(TRIP_CITY if by_city else TRIP_COUNTRY)
        best_ = best[0].upper() + best[1:]
        say[f"trip{i}"] = (at, text.format(city=city, country=country, best=best, Best=best_))
        place = country if by_city else city  # the name the turn does not say
        named = place if rng.random() < 0.5 else city if by_city else country
        ask.append(("temporal", f"When did {s} go to {named}?", _date_key(f"trip{i}"),
                    (f"trip{i}",)))
        ask.append(("single-hop", f"What did {s} enjoy most about visiting {place}?", best,
                    (f"trip{i}",)))
    outdoors = rng.random() < 0.5
    hobbies = rng.sample(OUTDOOR if outdoors else INDOOR, 2)
    for h, (name, texts) in enumerate(hobbies):
        for i, text in enumerate(texts):
            say[f"hobby{h}{i}"] = (rng.randrange(n), text)
        where = "outdoors" if outdoors else "at home"
        other = hobbies[1 - h][0]
        ask.append(("single-hop", f"Which pastime {where} does {s} do, besides {other}?", name,
                    (f"hobby{h}0", f"hobby{h}1")))
    all_hobbies = tuple(f"hobby{h}{i}" for h in range(2) for i in range(2))
    if outdoors:
        q = rng.choice([f"Would {s} likely enjoy a weekend hiking trip?",
                        f"Would {s} be up for a camping weekend in the hills?"])
        ask.append(("open-domain", q, "yes, an outdoors person", all_hobbies))
    else:
        q = rng.choice([f"Would {s} rather spend a free day indoors than on a mountain?",
                        f"Is {s} more of a homebody than an adventurer?"])
        ask.append(("open-domain", q, "yes, hobbies at home", all_hobbies))
    sib, sib_names = rng.choice(SIBS)
    kid, kin, kid_names = rng.choice(KIDS)
    baby = rng.choice(kid_names)
    say["baby"] = (rng.choice(spare), f"My {sib} {rng.choice(sib_names)} had the baby! "
                   f"A little {kid} called {baby}, 3.4 kg.")
    age = rng.choice([60, 65, 70, 75])
    say["dad"] = (rng.randrange(n), f"Dad turned {age} yesterday, we took him out for steak.")
    thing, buy_q, buy_text = rng.choice(BUYS)
    say["buy"] = (rng.randrange(n), buy_text)
    ill, ill_text = rng.choice(ILLS)
    say["ill"] = (rng.choice(spare), ill_text)
    plan, plan_q, plan_text = rng.choice(PLANS)
    say["plan"] = (rng.randrange(n), plan_text)

    pet_q = rng.choice([f"What is the name of {s}'s {species}?",
                        f"What did {s} call the new {young}?"])
    ill_q = rng.choice([f"What health problem did {s} have?",
                        f"Why was {s} out of action for a while?"])
    a, b = rng.sample(range(3), 2)
    first = a if say[f"trip{a}"][0] < say[f"trip{b}"][0] else b
    one, two, when, guess = "single-hop", "multi-hop", "temporal", "open-domain"
    ask += [
        (one, f"What kind of pet does {s} have?", f"a {breed} {species}", ("pet",)),
        (one, pet_q, pet, ("pet",)),
        (one, f"What did {s} do for a living before switching careers?", old[0],
         ("oldjob0", "oldjob1")),
        (one, f"What is {s}'s current occupation?", new[0], ("change", "newjob")),
        (one, f"Which city did {s} live in before relocating?", here, ("oldcity",)),
        (one, f"Where does {s} live now?", there, ("move", "newcity")),
        (one, f"What is the name of {s}'s {kin}?", baby, ("baby",)),
        (one, f"How old is {s}'s father?", str(age), ("dad",)),
        (one, buy_q.format(s=s), thing, ("buy",)),
        (one, ill_q, ill, ("ill",)),
        (one, plan_q.format(s=s), plan, ("plan",)),
        (when, f"When did {s} adopt an animal?", _date_key("pet"), ("pet",)),
        (when, f"When did {s} change jobs?", _date_key("change"), ("change",)),
        (when, f"When did {s} move house?", _date_key("move"), ("move",)),
        (when, f"When was {s}'s {kin} born?", _date_key("baby"), ("baby",)),
        (when, f"When did {s} get hurt or fall ill?", _date_key("ill"), ("ill",)),
        (two, f"Which city did {s} move to after changing jobs?", there, ("change", "move")),
        (two, f"What was {s}'s job while living in {here}?", old[0],
         ("oldcity", "oldjob0", "oldjob1")),
        (two, f"Did {s} get {pet} before or after leaving {here}?",
         "before" if say["pet"][0] < move else "after", ("pet", "move")),
        (two, f"Which trip came first for {s}: {trips[a][0]} or {trips[b][0]}?", trips[first][0],
         (f"trip{a}", f"trip{b}")),
        (guess, f"Would {s} know what to do about {new[2]} now?", "yes", ("change", "newjob")),
        (guess, f"Would {s} need a pet sitter when going away?", "yes", ("pet",)),
        (guess, f"Is {s} an aunt or uncle?", "yes", ("baby",)),
    ]
    # fmt: on
    return f


def _date_key(key: str) -> str:
    """A placeholder answer: the date of the session of the turn ``key``, filled in later."""
    return f"@date:{key}"


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _filler(rng: random.Random, other: str) -> str:
    roll = rng.random()
    if roll < 0.45:
        template = rng.choice(SMALL)
        return template.format(
            show=rng.choice(SHOWS),
            dish=rng.choice(DISHES),
            weather=rng.choice(WEATHER),
            month=rng.choice(MONTHS),
            breed=rng.choice(PETS)[1],
            city=rng.choice(CITIES),
            country=rng.choice(TRIPS)[1],
            hobby=rng.choice(OUTDOOR + INDOOR)[0],
            job=_a(rng.choice(JOBS)[0]),
            o=other,
        )
    return rng.choice(REACT if roll < 0.75 else ASK if roll < 0.9 else ANSWER)


def _conversation(rng: random.Random, index: int) -> Conversation:
    a, b = rng.sample(NAMES, 2)
    cid = f"conv{index:02d}"
    count = rng.randint(16, 22)
    avoid: dict[str, object] = {}
    people = {a: _person(rng, a, count, avoid), b: _person(rng, b, count, avoid)}
    day = dt.date(2022, 1, 1) + dt.timedelta(days=rng.randrange(365))
    conv = Conversation(cid, (a, b))
    where: dict[tuple[str, str], Turn] = {}
    for s in range(count):
        date = _date(day)
        day += dt.timedelta(days=rng.randint(3, 21))
        facts = [
            (who, key, text)
            for who, f in people.items()
            for key, (at, text) in f.says.items()
            if at == s
        ]
        rng.shuffle(facts)
        first = rng.choice((a, b))
        second = b if first == a else a
        lines: list[tuple[str, str, str]] = [
            (first, rng.choice(GREET).format(o=second), ""),
            (second, rng.choice(GREET_BACK), ""),
        ]
        length = max(rng.randint(15, 36), 2 * len(facts) + 6)  # a fact and its answer: 2
        body: list[list[tuple[str, str, str]]] = [[] for _ in range(length - 3 - 2 * len(facts))]
        for who, key, text in facts:
            other = b if who == a else a
            pair = [(who, text, key), (other, rng.choice(REACT), "")]
            body.insert(rng.randrange(len(body) + 1), pair)
        speaker = first
        for slot in body:
            if not slot:
                other = b if speaker == a else a
                slot.append((speaker, _filler(rng, other), ""))
                speaker = other
            lines += slot
        lines.append((b if lines[-1][0] == a else a, rng.choice(CLOSE), ""))
        session = []
        for t, (who, text, key) in enumerate(lines):
            turn = Turn(f"{cid}:D{s + 1}:{t + 1}", date, who, text)
            session.append(turn)
            if key:
                where[who, key] = turn
        conv.sessions.append(session)
    for who, f in people.items():
        for kind, text, answer, keys in f.ask:
            evidence = tuple(where[who, k].id for k in keys)
            if answer.startswith("@date:"):
                answer = where[who, answer[6:]].date
            conv.questions.append(
                Question(f"{cid}:Q{len(conv.questions) + 1}", kind, text, answer, evidence)
            )
    return conv


def generate(conversations: int = 11, seed: int = 20260508) -> list[Conversation]:
    """``conversations`` conversations (about 470 turns and 64 questions each), the same
    for the same arguments."""
    rng = random.Random(seed)
    return [_conversation(rng, i + 1) for i in range(conversations)]


CHATS = Path(__file__).resolve().parent / "data" / "chats"


def written(directory: Path = CHATS, conversations: int | None = None) -> list[Conversation]:
    """The written chats of ``directory`` (``chat-*.json``, in name order; the first
    ``conversations`` of them), turns' dates their sessions'."""
    out = []
    for path in sorted(directory.glob("chat-*.json"))[:conversations]:
        data = json.loads(path.read_text(encoding="utf-8"))
        cid = data["id"]
        first, second = data["speakers"]
        conv = Conversation(cid, (first, second))
        for session in data["sessions"]:
            conv.sessions.append(
                [
                    Turn(f"{cid}:{t['id']}", session["date"], t["speaker"], t["text"])
                    for t in session["turns"]
                ]
            )
        for n, q in enumerate(data["questions"], 1):
            evidence = tuple(f"{cid}:{e}" for e in q["evidence"])
            conv.questions.append(
                Question(f"{cid}:Q{n}", q["kind"], q["question"], q["answer"], evidence)
            )
        out.append(conv)
    return out


if __name__ == "__main__":
    data = generate()
    turns = sum(len(c.turns) for c in data)
    questions = [q for c in data for q in c.questions]
    print(f"{len(data)} conversations, {turns} turns, {len(questions)} questions")
    for kind in KINDS:
        print(f"  {kind}: {sum(q.kind == kind for q in questions)}")
    c = data[0]
    for t in c.sessions[3]:
        print(t.id, t.content)
    for q in c.questions[:60:6]:
        print(q.kind, q.text, "->", q.answer, q.evidence)
