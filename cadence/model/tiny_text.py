"""The small English text the built-in tokenizer learns its merges from (written for this project)."""

from __future__ import annotations

TINY_TEXT = """\
The morning was cold and clear, and the river ran slowly under the old stone bridge. A man
walked along the bank with his dog, and the dog ran ahead to look at the ducks. When the sun
came over the hill, the water turned from grey to gold, and the town began to wake up.

In the market square the first stalls were opening. There were apples and pears, bread that
was still warm, cheese from the farms in the valley, and flowers in every colour. People said
good morning to each other and talked about the weather, the price of coffee, and the news from
the city. A small café on the corner put its tables outside, and the smell of fresh coffee
filled the street.

The school bell rang at eight. Children ran through the gate with their bags and their books,
and the teacher stood at the door to count them. Today they would learn about the stars: how
far away they are, why they shine, and how sailors once used them to find their way across the
sea at night. One of the children asked whether the stars would ever run out of light, and the
teacher said that they would, but not for a very, very long time.

At the station, a train was waiting to leave for the coast. The engine was quiet, the doors
were open, and a few travellers were looking for their seats. An old woman carried a basket of
eggs; a young man carried a guitar; a family with three small children carried far too many
bags. The guard checked his watch, blew his whistle, and the train began to move.

Work in the town went on as it always had. The baker made bread, the builder built walls, the
doctor saw her patients, and the writer sat by the window and wrote. She was writing a story
about a lighthouse keeper who lived alone on a rock in the sea. Every night he climbed the
stairs, lit the lamp, and watched the ships pass. Every morning he wrote a letter that he never
sent. The story was not finished yet, but she knew how it would end.

In the afternoon the wind changed. Clouds came in from the west, and the first drops of rain
fell on the roofs and the streets. People opened their umbrellas or ran for the nearest door.
The ducks on the river did not seem to mind at all. The dog, who was now home again, lay by the
fire and slept, and dreamed of ducks.

A computer is a machine that follows instructions. It reads numbers from memory, does simple
things with them, and writes the results back. It does this very quickly, many millions of
times every second, and that is why it can seem to think. A program is a list of instructions
written by people. A good program is clear and simple; a bad one is long and hard to read, and
nobody wants to change it. Most programs are somewhere in between.

When you learn a new language, you start with small words: the, and, is, it, you, we, they.
Then you learn how to put them together into sentences, and the sentences into stories. It
takes time, and it is hard at first, but every day it gets a little easier. One day you notice
that you are thinking in the new language, and you did not even try.

The evening came slowly. The rain stopped, the clouds opened, and the first stars appeared above
the hill. In the houses along the river the lights came on one by one. Somebody was playing the
piano, somebody was cooking soup, and somebody was reading a book about the sea. The town was
quiet again, and the river ran on under the bridge, as it had for a thousand years.

The garden behind the house was small, but it was full of life. There were tomatoes and beans,
a row of potatoes, and a tall sunflower that leaned over the fence to look at the neighbours.
Birds came every morning to eat the seeds, and in the summer the bees were busy from sunrise to
sunset. The old man who looked after the garden said that a garden teaches patience: you plant
something, you water it, you wait, and one day, when you have almost forgotten, it grows.

Long ago, before there were roads or maps, people travelled by following the rivers and the
mountains. They told each other stories about the places they had seen, and the stories became
songs, and the songs were remembered for hundreds of years. Some of those songs are still sung
today, in kitchens and in schools and around small fires on summer nights.

Numbers: one, two, three, four, five, six, seven, eight, nine, ten. 1, 2, 3, 10, 42, 100, 2024.
Questions: What time is it? Where are you going? Why is the sky blue? How does this work?
Some words from other languages: naïve, déjà vu, über, señor, façade, crème brûlée — and the
café again, because everybody likes a good café.
"""
